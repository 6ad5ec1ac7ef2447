"""Values after a key that names personal data or a secret, in free text.

``password=x``, ``'email': 'a@b.c'``, ``"name": "José"``, ``address={'line1': '221B Baker
Street'}``, and JSON text inside a JSON string (``\\"name\\": \\"Jos\\\\u00e9\\"``) or nested
deeper (``\\\\\\"name\\\\\\":`` three ``json.dumps`` deep), up to seven ``json.dumps`` deep or
the repr of six (:data:`~jobsystem.privacy.scrub_text.QUOTE_SLASHES`). A key is a word, or a
name of several words written in words (``date of birth:``, ``passport number:``, ``Passport
No.:``: :mod:`scrub_key_before`), which ``is`` may follow too (``passport number is X1234567``),
or a space before a number or a date (``ssn 078-05-1120``: :mod:`scrub_is_value`). A quoted value
ends at its quote, a value in brackets at the bracket that closes it
(:func:`~jobsystem.privacy.scrub_freeform.bracketed_end`; after a number's key, where the number
in it, or begun by it, ends: ``phone=(555) 123-4567``); an unquoted one is a word, or runs on as
far as the caller's ``value_end`` says (:mod:`scrub_extents`: an address or a date of birth, a
person's name, a phone number in groups). An exception's class name before its message
(``InvalidRecipient: recipient address is not valid``) is no key: :mod:`scrub_exception_names`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import lru_cache

from jobsystem.privacy.scrub_exception_names import is_exception_name
from jobsystem.privacy.scrub_extents import GROUP_END
from jobsystem.privacy.scrub_freeform import bracketed_end
from jobsystem.privacy.scrub_is_value import joins, separators
from jobsystem.privacy.scrub_key_before import Key, key_before
from jobsystem.privacy.scrub_keys import NUMBER_LABELS, SECRET_LABELS, KeyMatcher
from jobsystem.privacy.scrub_spaces import SPACE, SPACE_CHARS
from jobsystem.privacy.scrub_text import QUOTE_SLASHES, Replace, already_removed, unescaped

__all__ = ["SHAPED_LABELS", "ValueEnd", "key_values"]

_HEX12 = re.compile(r"[0-9a-f]{12}")
#: A value that opens with a bracket (after spaces of any kind: :mod:`scrub_spaces`), and a port
#: after an IPv6 address in brackets.
_OPEN_BRACKET = re.compile(rf"{SPACE}*[(\[{{<]")
_PORT = re.compile(r":\d{1,5}(?!\d)")
#: A number's first group in brackets, and the digits joined to it: ``(555)`` of ``(555) 123-4567``,
#: ``(555)123-4567``, ``(+44)``, ``(0)20``; it ends where a group of digits ends.
_BRACKETED_GROUP = re.compile(r"\(\+?\d{1,5}\)(?:\d+(?:[\-/]\d+)*)?" + GROUP_END)
#: The first word inside a bracket (after spaces), and what follows a number there: its bracket's
#: end, or a ``,`` and the next item.
_INNER_WORD = re.compile(rf"{SPACE}*[^\s\"',;&(){{}}\[\]<>]+")
_AFTER_ITEM = re.compile(rf"{SPACE}*([,)\]}}>])")
#: A bracket whose first item is quoted: a repr's or JSON's list, its items' shapes tested as a whole.
_QUOTED_ITEM = re.compile(rf"{SPACE}*[\"'\\]")
_CLOSING = {"(": ")", "[": "]", "{": "}", "<": ">"}


def _nested_quotes(slashes: int) -> str:
    """A value quoted by ``"`` after ``slashes`` backslashes, as JSON text nested in JSON strings
    quotes it: ``\\"`` inside one string, ``\\\\\\"`` inside a string inside another. Inside it, a
    quote after any other number of backslashes, and any other escape, is part of the value."""
    others = rf"\\{{{slashes + 1},}}" + (rf"|\\{{1,{slashes - 1}}}" if slashes > 1 else "")
    return rf'\\{{{slashes}}}"(?:[^\\"]|\\+[^\\"]|(?:{others})")*\\{{{slashes}}}"'


@lru_cache(maxsize=QUOTE_SLASHES)
def _nested_value(slashes: int) -> re.Pattern[str]:
    """:func:`_nested_quotes` compiled, for 1 to :data:`QUOTE_SLASHES` backslashes: each level of
    JSON strings doubles them and adds one (1, 3, 7...), the repr of such text doubles them (2, 6...)."""
    return re.compile(_nested_quotes(slashes))


#: A value: quoted, or a bare word (a value quoted in nested JSON text: :func:`_nested_value`).
_VALUE = re.compile(r"\s*(?P<val>\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|[\"']?[^\s\"',;&(){}\[\]<>]+)")


def _value_at(text: str, pos: int) -> tuple[int, int] | None:
    """Where the value after a separator at ``pos - 1`` begins and ends, spaces skipped: quoted in
    nested JSON text, else quoted, else a bare word; None if none starts there."""
    value = _VALUE.match(text, pos)
    if value is None:
        return None
    begin = value.start("val")
    if text[begin] == "\\":  # a bare word so far: nested JSON text's quote, or a word
        run = text[begin : begin + QUOTE_SLASHES + 1]
        slashes = len(run) - len(run.lstrip("\\"))
        if slashes <= QUOTE_SLASHES and text[begin + slashes : begin + slashes + 1] == '"':
            nested = _nested_value(slashes).match(text, begin)
            if nested is not None:
                return nested.span()
    return value.span("val")


def _decodes(slashes: int) -> int:
    """How many times a value quoted after ``slashes`` backslashes is JSON-decoded to read as the
    same text one level deep (``"Jos\\u00e9"``): once per level of JSON strings around it, which
    is ``slashes.bit_length()`` (1: once, 3: twice, 7: three times); as often for its repr, whose
    backslashes are doubled (2: twice, as Dramatiq's DecodeError logs a body, ``b'{"a": "{\\\\"name...'``)."""
    return slashes.bit_length()


#: Labels whose values have a shape of their own: in free text, an unquoted value after such a key
#: is replaced only if it could be one (``actor 'send_email': rate_limit`` is no email address).
SHAPED_LABELS: dict[str, Callable[[str], bool]] = {
    "email": lambda value: "@" in value or "%40" in value.lower(),
    "phone": lambda value: any(c.isdigit() for c in value),
    "card": lambda value: any(c.isdigit() for c in value),
    "iban": lambda value: any(c.isdigit() for c in value),
    "ip": lambda value: any(c.isdigit() for c in value) or ":" in value,
}


def _json_unescaped(text: str) -> str:
    """``text`` (a JSON string's content) with one level of JSON escapes decoded: JSON text inside
    a JSON string hashes as the same text alone; as it is if it does not decode."""
    try:
        decoded = json.loads(f'"{text}"')
    except ValueError:
        return text
    return decoded if isinstance(decoded, str) else text


#: ``value_end(label, key, text, begin, stop)``: where an unquoted value whose first word is
#: ``text[begin:stop]`` ends, after ``key``, labelled ``label``.
ValueEnd = Callable[[str, str, str, int, int], int]


def key_values(
    text: str,
    keys: KeyMatcher,
    replace: Replace,
    value_end: ValueEnd,
    own_hashes: bool = False,
    spaced: bool = False,
) -> str:
    """Values after a sensitive key named in the text: ``password=x``, ``'email': 'a@b.c'``.
    ``own_hashes``: the scrubber writes ``label:<12 hex digits>`` (it has a hash key), so such a
    value after its label is its own output and stays; without one, ``phone:447700900123`` is a
    phone number. A secret is never hashed: ``password:a1b2c3d4e5f6`` is always a password.
    ``spaced``: the text has five digits close together, so a key may be joined to its value by
    a space too (``ssn 078-05-1120``: :mod:`~jobsystem.privacy.scrub_is_value`)."""
    parts: list[str] = []
    done = 0
    refused: dict[str, int] = {}  # by label, where the last value in brackets it refused ends
    pattern = separators(text, keys, spaced)
    if pattern is None:
        return text
    for separator in pattern.finditer(text):
        at, pos = separator.span()
        if at < done:
            continue
        key = key_before(text, at, done, keys)
        if key is None or is_exception_name(text, at, key.name, key.label, key.adjacent):
            continue  # no key, or an exception's ``Type: message`` (its message is read on)
        if text[at] not in ":=" and (key.quote or not joins(text, at, pos, key.name, key.label)):
            continue  # `` is `` or spaces, and no value they join the key to
        label = key.label
        value = _value_at(text, pos)
        if value is None:  # ``address={'line1': ...}``, ``ip_address=[2001:db8::1]:443``
            span = _bracketed(text, pos, key, replace, value_end, refused)
        else:
            own_hash = own_hashes and text[at] == ":" and value[0] == pos
            span = _word_or_quoted(text, value, label, key, own_hash, replace, value_end)
        if span is not None:
            begin, stop, replaced = span
            parts += (text[done:begin], replaced)
            done = stop
    if not parts:
        return text
    parts.append(text[done:])
    return "".join(parts)


def _word_or_quoted(
    text: str,
    value: tuple[int, int],
    label: str,
    key: Key,
    own_hash: bool,
    replace: Replace,
    value_end: ValueEnd,
) -> tuple[int, int, str] | None:
    """Where the value whose first word or quoted text is ``text[slice(*value)]``, after ``key``,
    begins and ends, and what replaces it; None if it stays. ``own_hash``: the scrubber hashes and
    the value follows ``:`` at once (see :func:`key_values`)."""
    own_hash = own_hash and label not in SECRET_LABELS and key.adjacent
    begin, stop = value
    first = text[begin:stop]
    if first[0] not in "\"'\\" and not _replacement(first, own_hash):
        stop = value_end(label, key.name, text, begin, stop)
    replaced = _pair_value(label, key.name, text[begin:stop], own_hash, replace)
    return None if replaced is None else (begin, stop, replaced)


def _bracketed(
    text: str, pos: int, key: Key, replace: Replace, value_end: ValueEnd, refused: dict[str, int]
) -> tuple[int, int, str] | None:
    """A value in brackets at ``pos`` (after spaces): where it begins and ends (with a port after
    it: ``[2001:db8::1]:443``), and what replaces it, quoted as its key is (``"address":
    "[address]"`` keeps JSON text JSON); None if there is none, or it stays: empty (``[]``), a
    replacement already (``[address]``), or not of its label's shape (``'send_email': ['welcome']``).
    After a number's key, :func:`_bracketed_number` says where it ends.

    ``refused``: by label, the end of the last value in brackets refused on this text. One that
    begins inside it is refused unread: it ends inside it (a bracket opened in a bracket closes
    in it), and a part of a value without its label's shape (an ``@``, a digit) has none either.
    Read again, each such value cost the rest of its line: 9,300 ``email=(`` took some 40 s."""
    opening = _OPEN_BRACKET.match(text, pos)
    if opening is None:
        return None
    begin, label = opening.end() - 1, key.label
    if label in NUMBER_LABELS and not _QUOTED_ITEM.match(text, begin + 1):
        number_end = _bracketed_number(text, begin, key, value_end)
        if number_end is None:
            return None
        stop = number_end
    elif begin < refused.get(label, -1):
        return None
    else:
        stop = bracketed_end(text, begin)
        if text[stop - 1 : stop] == "]" and (port := _PORT.match(text, stop)):
            stop = port.end()
    value = text[begin:stop]
    shaped = SHAPED_LABELS.get(label)
    if already_removed(value) or not value[1:].strip(" \t)]}>") or (shaped is not None and not shaped(value)):
        refused[label] = stop
        return None
    return begin, stop, f"{key.quote}{replace(label, value)}{key.quote}"


def _bracketed_number(text: str, begin: int, key: Key, value_end: ValueEnd) -> int | None:
    """Where a number after a number's key (a phone, a card...) that opens with the bracket at
    ``begin`` ends, or None if the bracket holds no such number (``phone: (retry 3 of 5)``, as
    ``card: (attempt 2 of 3)``, is a remark: no number reads so). Either its first group is in
    brackets and the groups after it are the number's (``(555) 123-4567``, ``(020) 7946 0958``),
    as far as ``value_end`` reads them; or ``value_end`` reads the bracket's first word to its
    closing bracket (``(+44 7700 900123)``, ``[4111 1111 1111 1111]``), or to a ``,`` after which
    more items follow (``[+44 7700 900123, +44 7700 900456]``: all of the bracket)."""
    group = _BRACKETED_GROUP.match(text, begin)
    if group is not None:
        return value_end(key.label, key.name, text, begin, group.end())
    word = _INNER_WORD.match(text, begin + 1)
    if word is None:
        return None
    first = word.end() - len(word[0].lstrip(SPACE_CHARS))
    end = value_end(key.label, key.name, text, first, word.end())
    closing = _CLOSING[text[begin]]
    if text[end - 1] == ")" == closing:
        return end  # a group of digits takes the ``)`` after it: ``(+44 7700 900123)``
    after = _AFTER_ITEM.match(text, end)
    if after is None or after[1] not in (closing, ","):
        return None
    return after.end() if after[1] == closing else bracketed_end(text, begin)


def _replacement(word: str, own_hash: bool) -> bool:
    """Whether ``word`` is a replacement (``[phone]``, our own ``phone:<hash>``): a value that ran
    on from it would change the scrubber's own output."""
    return already_removed(word) or (own_hash and bool(_HEX12.fullmatch(word)))


def _pair_value(label: str, key: str, value: str, own_hash: bool, replace: Replace) -> str | None:
    slashes = len(value) - len(value.lstrip("\\"))
    if 0 < slashes <= QUOTE_SLASHES and len(value) >= 2 * slashes + 2 and value[slashes] == '"':
        quote, inner = value[: slashes + 1], value[slashes + 1 : -slashes - 1]  # nested JSON text
        if not inner.strip() or inner.startswith("[") or already_removed(inner):
            return None
        for _ in range(_decodes(slashes)):
            inner = _json_unescaped(inner)
        return f"{quote}{replace(label, unescaped(inner))}{quote}"
    quote = value[0] if value[0] in "\"'" else ""
    closed = bool(quote) and len(value) > 1 and value.endswith(quote)
    inner = value[1:-1] if closed else value[len(quote) :]
    if not inner.strip() or inner.startswith("[") or already_removed(inner):
        return None
    if own_hash and label == key.lower() and _HEX12.fullmatch(inner):
        return None  # our own ``label:hash``
    shaped = SHAPED_LABELS.get(label)
    if not quote and shaped is not None and not shaped(inner):
        return None  # a bare word after a key, not a value of it (``'send_email': rate_limit``)
    # Hashed as the value it stands for: ``"Jos\\u00e9"`` in JSON text is ``José`` written elsewhere.
    return f"{quote}{replace(label, unescaped(inner))}{quote if closed else ''}"
