"""How far a free-form value runs after its key in free text (``address=221B Baker Street status=ok``).

An unquoted value was one word: ``address=221B Baker Street`` logged ``[address] Baker Street``,
``dob: 12 March 1980`` logged ``[birth_date] March 1980``. A free-form value (an address, a date
of birth or a postcode in no shape :mod:`scrub_value_shapes` knows, the value of a key added by
configuration) runs on from its first word to the first of:

- the line's next ``key=value`` or ``key: value`` pair (a key starting with a letter or ``_``,
  quoted or not, then ``=``, or ``:`` that starts no ``::`` or ``://``): ``address=221B Baker
  Street status=failed`` keeps ``status=failed``, ``address: 5 Rue X error: timeout`` keeps
  ``error: timeout``; but not a label inside an address, an unquoted ``Word:`` capitalised
  (``Floor: 2``, ``Attn: Billing``) that is none of a log's own fields (``Error:``, ``Status:``,
  ``Reason:``, an exception's class ``ValueError:``), or an address's part in any case
  (``apt: 4B``, ``floor: 2``): ``address=Flat 3, Floor: 2, 10 Downing Street`` is one address;
- a closing bracket or quote that opened before the key: ``(address: 5 rue de la Paix) sent``,
  ``"note": "address: 5 rue de la Paix", "n": 1``; one that opens inside the value closes inside it;
- the end of the line.

The separators before that end stay (``, status=failed``; a ``.`` that ends a sentence; a
bracket that opens just before it, ``[type=value_error]``). When in doubt the value runs on
(remove when in doubt): a quote opens only at the start of a word and closes only at the end of
one (``d'Alsace`` is one word), and a bracket that closes nothing opened before the key ends nothing.
A space is any of :mod:`scrub_spaces` (a no-break space, a narrow one, a tab), as in a key before
it: ``error\\u00a0: timeout`` ends an address as ``error: timeout`` does, and a quote after one opens.
"""

from __future__ import annotations

import re
import threading

from jobsystem.privacy.scrub_keys import EXTRA_LABEL
from jobsystem.privacy.scrub_spaces import SPACE, SPACE_CHARS

__all__ = ["FREEFORM_LABELS", "bracketed_end", "freeform_end"]

#: Labels whose values are free text: addresses (postcodes too), dates of birth, configured keys.
FREEFORM_LABELS = frozenset({"address", "birth_date", EXTRA_LABEL})

#: A quote with the backslashes that escape it in JSON text, taken from the first of them only: a
#: run of backslashes is tried once, not again from each of its backslashes (a run not followed by
#: a quote made every scan over it cost its length squared: 40,000 backslashes, 18 s).
_QUOTE = r"(?:(?:(?<!\\)\\+)?[\"'])"
#: What may end a value, in the order tried at one place: the next pair's key, the line's end, a
#: bracket, a quote (with the backslashes that escape it in JSON text).
_STOP = re.compile(
    rf"(?<![A-Za-z0-9_\-])(?P<key>(?P<quoted>{_QUOTE})?(?P<word>[A-Za-z_][A-Za-z0-9_\-]*)(?:\\*[\"'])?"
    rf"{SPACE}*(?:=|(?P<colon>:)(?![:/])))"
    rf"|(?P<line>[\r\n])|(?P<open>[(\[{{<])|(?P<close>[)\]}}>])|(?P<quote>{_QUOTE})"
)
#: Labels an address holds, in any case: ``key: value`` pairs inside it, not after it.
_ADDRESS_PARTS = frozenset(
    {"apt", "apartment", "flat", "floor", "unit", "suite", "ste", "attn", "attention", "building", "bldg"}
    | {"block", "room", "dept", "department", "door", "entrance", "stair", "staircase", "po", "box"}
)
#: Capitalised keys that end a free-form value: a log's own fields, not labels inside an address.
_LOG_FIELDS = frozenset(
    {"error", "err", "exception", "reason", "cause", "status", "code", "result", "message", "msg", "detail"}
    | {"details", "level", "warning", "warn", "info", "debug", "critical", "fatal", "traceback", "job"}
    | {"task", "actor", "queue", "attempt", "attempts", "retry", "retries", "duration", "elapsed", "took"}
    | {"time", "timestamp", "response", "request", "url", "method", "path", "id", "hint", "type"}
)
#: Ends of a capitalised key naming an exception's class (``ValueError:``, ``TimeoutException:``).
_LOG_FIELD_ENDS = ("error", "exception", "warning", "failure")
#: Brackets and quotes, to find those open where a value starts.
_MARK = re.compile(rf"[(\[{{<)\]}}>]|{_QUOTE}")
_OPENING = {")": "(", "]": "[", "}": "{", ">": "<"}
_CLOSING = {opening: closing for closing, opening in _OPENING.items()}
_LINE = re.compile(r"[\r\n]")
#: What a quote follows when it opens a quoted text: the line's start, a space (of any kind:
#: :mod:`scrub_spaces`), a bracket, ``=:,``.
_BEFORE_OPENING_QUOTE = frozenset(SPACE_CHARS + "([{<=:,")
#: Separators left out at a value's end, before what ends it, and brackets opened just before it
#: (``address: 5 Main St [type=value_error]`` keeps its ``[``).
_TRAILING = frozenset(SPACE_CHARS + ",;&|.-\u2013\u2014([{<")
#: Per thread, the last look for open brackets and quotes: (text, where, its line's start, open).
_RECENT = threading.local()


def freeform_end(text: str, begin: int, stop: int) -> int:
    """Where a free-form value whose first word is ``text[begin:stop]`` ends (see the module)."""
    outer: list[str] | None = None  # open where the value starts: looked for at the first closer
    inner: list[str] = []
    end = len(text)
    for match in _STOP.finditer(text, stop):
        kind, mark = match.lastgroup, match[0]
        if kind == "line" or (kind == "key" and _ends_value(match)):
            end = match.start()
            break
        if kind == "key":
            continue
        if kind == "open":
            inner.append(mark)
            continue
        opening = _OPENING.get(mark, mark)
        closes = kind == "close" or _closes(text, match.end())
        if inner and inner[-1] == opening:
            if closes:
                inner.pop()
            continue
        if outer is None:
            outer = _open_at(text, begin)
        if closes and opening in outer:
            end = match.start()
            break
        if kind == "quote" and _opens(text, match.start(), -1):
            inner.append(mark)
    while end > stop and text[end - 1] in _TRAILING:
        end -= 1
    return max(end, stop)


def bracketed_end(text: str, begin: int) -> int:
    """Where a value that opens with a bracket at ``text[begin]`` ends (``{'line1': '221B Baker
    Street', 'city': 'London'}``, ``['Ana', 'Lopez']``, ``(...)``, ``<Address: 5 Main St>``): after
    the bracket of its kind that closes it, brackets of other kinds (``->`` in ``(a -> b)``) and
    quoted texts inside it (``'x)'``) not counted. A quote opens and closes as in a free-form value,
    with as many backslashes before it as the one that opened it (``\\"`` in nested JSON text).
    With no bracket closing it, at the end of its line (remove when in doubt)."""
    opening = text[begin]
    closing = _CLOSING[opening]
    depth = 0
    quote = ""  # the quote, with its backslashes, of a quoted text open inside the value
    for match in _MARK.finditer(text, begin):
        mark = match[0]
        if quote:
            if mark == quote and _closes(text, match.end()):
                quote = ""
        elif mark == opening:
            depth += 1
        elif mark == closing:
            depth -= 1
            if not depth:
                return match.end()
        elif mark[-1] in "\"'" and _opens(text, match.start(), begin):
            quote = mark
    line = _LINE.search(text, begin)
    return line.start() if line else len(text)


def _ends_value(key: re.Match[str]) -> bool:
    """Whether the pair whose key ``key`` found ends a free-form value: not a label inside an
    address (``Floor: 2``, ``Attn: Billing``, ``apt: 4B``), but a program's field (``status=``,
    ``error:``, quoted, or a log's own capitalised ``Error:``, ``ValueError:``)."""
    word = key["word"].lower()
    if key["colon"] is None or key["quoted"] is not None:
        return True
    if word in _ADDRESS_PARTS:
        return False
    return not key["word"][0].isupper() or word in _LOG_FIELDS or word.endswith(_LOG_FIELD_ENDS)


def _open_at(text: str, begin: int) -> list[str]:
    """The brackets and quotes open at ``begin`` on its line, innermost last (not to be changed).

    A line's values are looked at in order, so each look goes on from the one before on the same
    text (remembered per thread) and a line is read once, however many values it holds."""
    recent: tuple[str, int, int, list[str]] | None = getattr(_RECENT, "look", None)
    stack: list[str]
    if recent is not None and recent[0] is text and recent[1] <= begin:
        _, floor, line, stack = recent
        if after_line := max(text.rfind("\n", floor, begin), text.rfind("\r", floor, begin)) + 1:
            floor = line = after_line
            stack = []
    else:
        floor = line = max(text.rfind("\n", 0, begin), text.rfind("\r", 0, begin)) + 1
        stack = []
    for match in _MARK.finditer(text, floor, begin):
        mark = match[0]
        if mark in _OPENING:
            if stack and stack[-1] == _OPENING[mark]:
                stack.pop()
        elif mark[-1] not in "\"'":
            stack.append(mark)
        elif stack and stack[-1] == mark and _closes(text, match.end()):
            stack.pop()
        elif _opens(text, match.start(), line):
            stack.append(mark)
    _RECENT.look = (text, begin, line, stack)
    return stack


def _opens(text: str, at: int, floor: int) -> bool:
    """Whether the quote at ``at`` starts a word (a quoted text), not ends or sits inside one;
    ``floor``: where the text looked at starts, as a line's start does."""
    return at == floor or text[at - 1] in _BEFORE_OPENING_QUOTE


def _closes(text: str, after: int) -> bool:
    """Whether the quote ending at ``after`` ends a word (a quoted text), not starts or sits inside one."""
    return after >= len(text) or not (text[after].isalnum() or text[after] == "_")
