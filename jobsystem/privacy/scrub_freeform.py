"""How far a free-form value runs after its key in free text (``address=221B Baker Street status=ok``).

An unquoted value was one word: ``address=221B Baker Street`` logged ``[address] Baker Street``,
``dob: 12 March 1980`` logged ``[birth_date] March 1980``. A free-form value (an address, a date
of birth or a postcode in no shape :mod:`scrub_value_shapes` knows, the value of a key added by
configuration) runs on from its first word to the first of:

- the line's next ``key=value`` or ``key: value`` pair (a key starting with a letter or ``_``,
  quoted or not, then ``=``, or ``:`` that starts no ``::`` or ``://``): ``address=221B Baker
  Street status=failed`` keeps ``status=failed``;
- a closing bracket or quote that opened before the key: ``(address: 5 rue de la Paix) sent``,
  ``"note": "address: 5 rue de la Paix", "n": 1``; one that opens inside the value closes inside it;
- the end of the line.

The separators before that end stay (``, status=failed``; a ``.`` that ends a sentence). When in
doubt the value runs on (remove when in doubt): a quote opens only at the start of a word and
closes only at the end of one (``d'Alsace`` is one word), a bracket that closes nothing opened
before the key ends nothing, and a line is looked back over for its open brackets and quotes
1024 characters at most.
"""

from __future__ import annotations

import re

from jobsystem.privacy.scrub_keys import EXTRA_LABEL

__all__ = ["FREEFORM_LABELS", "freeform_end"]

#: Labels whose values are free text: addresses (postcodes too), dates of birth, configured keys.
FREEFORM_LABELS = frozenset({"address", "birth_date", EXTRA_LABEL})

#: What may end a value, in the order tried at one place: the next pair's key, the line's end, a
#: bracket, a quote (with the backslashes that escape it in JSON text).
_STOP = re.compile(
    r"(?<![A-Za-z0-9_\-])(?P<key>(?:\\*[\"'])?[A-Za-z_][A-Za-z0-9_\-]*(?:\\*[\"'])?[ \t]*(?:=|:(?![:/])))"
    r"|(?P<line>[\r\n])|(?P<open>[(\[{<])|(?P<close>[)\]}>])|(?P<quote>\\*[\"'])"
)
#: Brackets and quotes, to find those open where a value starts.
_MARK = re.compile(r"[(\[{<)\]}>]|\\*[\"']")
_OPENING = {")": "(", "]": "[", "}": "{", ">": "<"}
#: What a quote follows when it opens a quoted text: the line's start, a space, a bracket, ``=:,``.
_BEFORE_OPENING_QUOTE = frozenset(" \t([{<=:,")
#: Separators left out at a value's end, before what ends it.
_TRAILING = frozenset(" \t,;&|.-\u2013\u2014")
_LOOK_BACK = 1024


def freeform_end(text: str, begin: int, stop: int) -> int:
    """Where a free-form value whose first word is ``text[begin:stop]`` ends (see the module)."""
    outer = _open_at(text, begin)
    inner: list[str] = []
    end = len(text)
    for match in _STOP.finditer(text, stop):
        kind, mark = match.lastgroup, match[0]
        if kind == "key" or kind == "line":
            end = match.start()
            break
        if kind == "open":
            inner.append(mark)
        elif kind == "close":
            if inner and inner[-1] == _OPENING[mark]:
                inner.pop()
            elif _OPENING[mark] in outer:
                end = match.start()
                break
        elif inner and inner[-1] == mark:
            if _closes(text, match.end()):
                inner.pop()
        elif mark in outer and _closes(text, match.end()):
            end = match.start()
            break
        elif _opens(text, match.start(), -1):
            inner.append(mark)
    while end > stop and text[end - 1] in _TRAILING:
        end -= 1
    return max(end, stop)


def _open_at(text: str, begin: int) -> list[str]:
    """The brackets and quotes open at ``begin`` on its line, innermost last."""
    floor = max(text.rfind("\n", 0, begin) + 1, text.rfind("\r", 0, begin) + 1, begin - _LOOK_BACK)
    stack: list[str] = []
    for match in _MARK.finditer(text, floor, begin):
        mark = match[0]
        if mark in _OPENING:
            if stack and stack[-1] == _OPENING[mark]:
                stack.pop()
        elif mark[-1] not in "\"'":
            stack.append(mark)
        elif stack and stack[-1] == mark and _closes(text, match.end()):
            stack.pop()
        elif _opens(text, match.start(), floor):
            stack.append(mark)
    return stack


def _opens(text: str, at: int, floor: int) -> bool:
    """Whether the quote at ``at`` starts a word (a quoted text), not ends or sits inside one;
    ``floor``: where the text looked at starts, as a line's start does."""
    return at == floor or text[at - 1] in _BEFORE_OPENING_QUOTE


def _closes(text: str, after: int) -> bool:
    """Whether the quote ending at ``after`` ends a word (a quoted text), not starts or sits inside one."""
    return after >= len(text) or not (text[after].isalnum() or text[after] == "_")
