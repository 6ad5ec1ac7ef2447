"""Values after a key that names personal data or a secret, in free text.

``password=x``, ``'email': 'a@b.c'``, ``"name": "José"``, ``address={'line1': '221B Baker
Street'}``, and JSON text inside a JSON string (``\\"name\\": \\"Jos\\\\u00e9\\"``) or nested
deeper (``\\\\\\"name\\\\\\":`` three ``json.dumps`` deep), up to seven ``json.dumps`` deep or
the repr of six (:data:`~jobsystem.privacy.scrub_text.QUOTE_SLASHES`). A key is a word, or a
name of several words written in words (``date of birth:``, ``passport number:``), which ``is``
may follow too (``passport number is X1234567``: :data:`_SEPARATOR_OR_IS`). A quoted value ends at its quote,
a value in brackets at the bracket that closes it (:func:`~jobsystem.privacy.scrub_freeform.bracketed_end`;
after a number's key, where the number in it, or begun by it, ends: ``phone=(555) 123-4567``);
an unquoted one is a word, or runs on as far as the caller's ``value_end`` says
(:mod:`scrub_extents`: an address or a date of birth, a person's name, a phone number in groups).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import lru_cache
from typing import NamedTuple

from jobsystem.privacy.scrub_extents import GROUP_END
from jobsystem.privacy.scrub_freeform import bracketed_end
from jobsystem.privacy.scrub_is_value import reads_as_identifier
from jobsystem.privacy.scrub_keys import NUMBER_LABELS, SECRET_LABELS, KeyMatcher
from jobsystem.privacy.scrub_text import QUOTE_SLASHES, Replace, already_removed, unescaped

__all__ = ["SHAPED_LABELS", "ValueEnd", "key_values"]

_HEX12 = re.compile(r"[0-9a-f]{12}")
_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
_SEPARATOR = re.compile(r"[:=]")
#: The separators and `` is ``, looked for in a line that has one: after a key written in words,
#: a value that reads as an identifier (``passport number is X1234567``; ``phone number is
#: missing``, ``the card number is 16 digits long`` and ``token is expired`` are remarks):
#: :mod:`~jobsystem.privacy.scrub_is_value`. ``is`` as a key in words is written: ``PASSPORT NUMBER IS``.
_SEPARATOR_OR_IS = re.compile(r"[:=]| (?:is|IS|Is) ")
_IS_WRITTEN = (" is ", " IS ", " Is ")
#: A lower-case word, one space before a key written as a word (``email address:``).
_QUALIFIER = re.compile(r"(?<![\w\-.:=/@'\"])([a-z]{2,32}) \Z")
#: A word of letters ending where the search ends: one of a key written in words (``date of``).
_WORD_BEFORE = re.compile(r"(?<![\w\-])[A-Za-z]{1,32}\Z")
_APOSTROPHES = ("'", "\u2019")
#: A value that opens with a bracket (after spaces), and a port after an IPv6 address in brackets.
_OPEN_BRACKET = re.compile(r"[ \t]*[(\[{<]")
_PORT = re.compile(r":\d{1,5}(?!\d)")
#: A number's first group in brackets, and the digits joined to it: ``(555)`` of ``(555) 123-4567``,
#: ``(555)123-4567``, ``(+44)``, ``(0)20``; it ends where a group of digits ends.
_BRACKETED_GROUP = re.compile(r"\(\+?\d{1,5}\)(?:\d+(?:[\-/]\d+)*)?" + GROUP_END)
#: The first word inside a bracket (after spaces), and what follows a number there: its bracket's
#: end, or a ``,`` and the next item.
_INNER_WORD = re.compile(r"[ \t]*[^\s\"',;&(){}\[\]<>]+")
_AFTER_ITEM = re.compile(r"[ \t]*([,)\]}>])")
#: A bracket whose first item is quoted: a repr's or JSON's list, its items' shapes tested as a whole.
_QUOTED_ITEM = re.compile(r"[ \t]*[\"'\\]")
_CLOSING = {"(": ")", "[": "]", "{": "}", "<": ">"}
#: Address keys written as a word, that a word before them may qualify.
_ADDRESS_KEYS = frozenset({"address", "addr"})


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
) -> str:
    """Values after a sensitive key named in the text: ``password=x``, ``'email': 'a@b.c'``.
    ``own_hashes``: the scrubber writes ``label:<12 hex digits>`` (it has a hash key), so such a
    value after its label is its own output and stays; without one, ``phone:447700900123`` is a
    phone number. A secret is never hashed: ``password:a1b2c3d4e5f6`` is always a password."""
    parts: list[str] = []
    done = 0
    refused: dict[str, int] = {}  # by label, where the last value in brackets it refused ends
    separators = _separators(text, keys)
    if separators is None:
        return text
    for separator in separators.finditer(text):
        at, pos = separator.span()
        if at < done:
            continue
        key = _key_before(text, at, done, keys)
        if key is None or (pos - at > 1 and not _is_value(text, pos, key)):
            continue
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


def _separators(text: str, keys: KeyMatcher) -> re.Pattern[str] | None:
    """:data:`_SEPARATOR_OR_IS` when a `` is `` in ``text`` follows a word that may end a key in
    words (``number is``), else :data:`_SEPARATOR` if there is a ``:`` or ``=``, else None: the
    other lines with `` is `` (``worker 3 is stopping``) are not scanned for it (a pattern with
    `` is `` costs a line of 70 characters some 1.3 us). An `` is `` at the text's start follows no
    word: the search goes on past it (a fragment such as `` is due; passport number is X1234567``)."""
    for written in _IS_WRITTEN:
        at = text.find(written)
        while at >= 0:
            if text[text.rfind(" ", 0, at) + 1 : at].lower() in keys.phrase_ends:
                return _SEPARATOR_OR_IS
            at = text.find(written, at + 3)
    return _SEPARATOR if ":" in text or "=" in text else None


def _is_value(text: str, pos: int, key: _Key) -> bool:
    """Whether the text at ``pos``, after ``key`` and `` is ``, is its value: ``key`` is written in
    words, unquoted, and the text reads as an identifier, not a length or a remark
    (:func:`~jobsystem.privacy.scrub_is_value.reads_as_identifier`)."""
    return not key.quote and " " in key.name and reads_as_identifier(text, pos)


def _word_or_quoted(
    text: str,
    value: tuple[int, int],
    label: str,
    key: _Key,
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
    text: str, pos: int, key: _Key, replace: Replace, value_end: ValueEnd, refused: dict[str, int]
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


def _bracketed_number(text: str, begin: int, key: _Key, value_end: ValueEnd) -> int | None:
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
    first = word.end() - len(word[0].lstrip(" \t"))
    end = value_end(key.label, key.name, text, first, word.end())
    closing = _CLOSING[text[begin]]
    if text[end - 1] == ")" == closing:
        return end  # a group of digits takes the ``)`` after it: ``(+44 7700 900123)``
    after = _AFTER_ITEM.match(text, end)
    if after is None or after[1] not in (closing, ","):
        return None
    return after.end() if after[1] == closing else bracketed_end(text, begin)


class _Key(NamedTuple):
    """A key before a separator that names personal data or a secret: its name as written, its
    label, its quote (``"``, ``'``, ``\\"`` in nested JSON text; empty if unquoted), and whether it
    is unquoted and ends right at the separator (``phone:``, as the scrubber writes its own
    ``label:<hash>``)."""

    name: str
    label: str
    quote: str
    adjacent: bool


def _key_before(text: str, at: int, done: int, keys: KeyMatcher) -> _Key | None:
    """The key before the separator at ``at`` (nothing before ``done`` is looked at), None if it
    names nothing (the common case, kept cheap): a word of key characters, quoted or not (in
    nested JSON text too: ``\\"name\\":``), or written in words (``date of birth:``)."""
    end = at
    while end > done and text[end - 1] in " \t":
        end -= 1
    quoted = end > done and text[end - 1] in "\"'"
    start = end = end - quoted
    slashes = 0
    while quoted and slashes <= QUOTE_SLASHES and end - slashes > done and text[end - slashes - 1] == "\\":
        slashes += 1
    if 0 < slashes <= QUOTE_SLASHES:
        start = end = end - slashes  # ``\"name\":``, ``\\\"name\\\":``: nested JSON text
    while start > done and text[start - 1] in _KEY_CHARS and end - start < 64:
        start -= 1
    if start == end:
        return None
    key, label = text[start:end], keys.label(text[start:end])
    if label is None and text[start - 1 : start] == " ":
        key, label = _in_words(text, start, end, done, keys)
    elif label == "address" and not quoted and text[at] == ":":
        key, label = _qualified(text, start, done, key, label, keys.label)
    if label is None:
        return None
    return _Key(key, label, text[end : end + slashes + 1] if quoted else "", not quoted and end == at)


def _in_words(text: str, start: int, end: int, done: int, keys: KeyMatcher) -> tuple[str, str | None]:
    """The key ending with the word ``text[start:end]``, written in words one space apart, and its
    label (:meth:`KeyMatcher.label_of_words`): ``date of birth:``, ``Birth Date:``, ``zip code:``
    were a word that named nothing (``birth``, ``date``, ``code``), and the value after them passed."""
    word = text[start:end]
    if word.lower() not in keys.phrase_ends:
        return word, None
    words, starts, at = [word], [start], start
    while len(words) <= keys.phrase_words and at - 1 > done and text[at - 1] == " ":
        before = _WORD_BEFORE.search(text, max(done, at - 34), at - 1)
        if before is None:
            break
        written, at = before[0], before.start()
        if written in ("s", "S") and text[at - 1 : at] in _APOSTROPHES and at - 1 > done:
            owner = _WORD_BEFORE.search(text, max(done, at - 35), at - 1)  # ``driver's``: ``drivers``
            if owner is not None:
                written, at = f"{owner[0]}s", owner.start()
        words.insert(0, written)
        starts.insert(0, at)
    found = keys.label_of_words(words)
    if found is None:
        return word, None
    width, label = found
    return text[starts[-width] : end], label


def _qualified(
    text: str, start: int, done: int, key: str, label: str, label_for_key: Callable[[str], str | None]
) -> tuple[str, str]:
    """An address key before ``:`` read with the lower-case word written before it, one space
    apart, as its qualifier: ``email address:`` is an email key (pydantic's ``value is not a valid email
    address: An email address must have an @-sign.`` keeps its reason, no ``@`` in it), ``server
    address:`` a machine's; ``billing address:`` and ``new address:`` are still addresses. A
    capitalised word (``Email address:``, a field's label at a line's start) qualifies nothing."""
    word = _QUALIFIER.search(text, max(done, start - 33), start) if key.lower() in _ADDRESS_KEYS else None
    if word is None:
        return key, label
    qualified = f"{word[1]}_{key}"
    return qualified, label_for_key(qualified) or label


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
