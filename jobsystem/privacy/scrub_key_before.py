"""The key before a separator in free text, and its label (for :mod:`scrub_pairs`).

A key is a word of key characters, quoted or not (in nested JSON text too: ``\\"name\\":``), or a
name of several words written in words, a space apart (``date of birth:``, ``passport
number:``, ``numéro de sécurité sociale:``), whose number word may be abbreviated (``Passport
No.:``, ``Ausweis-Nr.:``, ``N°``) or a ``#`` (``Passport #:``, read as ``Passport no``). Words are read with
their accents (``Núm``), which the key matcher folds. A space is any of :mod:`scrub_spaces`, or a
run of them (``date\u00a0of birth:``, ``Passport\t#:``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NamedTuple

from jobsystem.privacy.scrub_keys import KeyMatcher
from jobsystem.privacy.scrub_spaces import SPACE, SPACE_CHARS, space_run_start
from jobsystem.privacy.scrub_text import QUOTE_SLASHES

__all__ = ["Key", "key_before"]

_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
#: A lower-case word, a space before a key written as a word (``email address:``).
_QUALIFIER = re.compile(rf"(?<![\w\-.:=/@'\"])([a-z]{{2,32}}){SPACE}{{1,4}}\Z")
#: A word of letters ending where the search ends: one of a key written in words (``date of``,
#: ``sécurité``).
_WORD_BEFORE = re.compile(r"(?<![\w\-])[^\W\d_]{1,32}\Z")
_APOSTROPHES = ("'", "\u2019")
#: Address keys written as a word, that a word before them may qualify.
_ADDRESS_KEYS = frozenset({"address", "addr"})
#: A number word abbreviated with a ``.`` right before a separator (``No.:``, ``Nr.:``, ``núm.:``).
_ABBREVIATED = re.compile(r"(?<!\w)(?i:no|nr|num|núm)\.\Z")


class Key(NamedTuple):
    """A key before a separator that names personal data or a secret: its name as written, its
    label, its quote (``"``, ``'``, ``\\"`` in nested JSON text; empty if unquoted), and whether it
    is unquoted and ends right at the separator (``phone:``, as the scrubber writes its own
    ``label:<hash>``)."""

    name: str
    label: str
    quote: str
    adjacent: bool


def key_before(text: str, at: int, done: int, keys: KeyMatcher) -> Key | None:
    """The key before the separator at ``at`` (nothing before ``done`` is looked at), None if it
    names nothing (the common case, kept cheap); see the module."""
    end = space_run_start(text, at, done)
    name_end, sign = end, False
    if end - 1 > done and text[end - 1] == "#":  # ``Passport #:``: a number's sign for its word
        sign, end = True, space_run_start(text, end - 1, done)
    elif text[end - 1 : end] == "." and _ABBREVIATED.search(text, max(done, end - 5), end):
        name_end = end = end - 1  # ``Passport No.:``: the word without its ``.``
    quoted = not sign and end > done and text[end - 1] in "\"'"
    start = end = end - quoted
    slashes = 0
    while quoted and slashes <= QUOTE_SLASHES and end - slashes > done and text[end - slashes - 1] == "\\":
        slashes += 1
    if 0 < slashes <= QUOTE_SLASHES:
        start = end = end - slashes  # ``\"name\":``, ``\\\"name\\\":``: nested JSON text
    # A key's word: ASCII letters, digits, ``_`` and ``-``, and other letters (``Núm``), and a
    # degree sign written for ``º`` (``N°``, the key matcher's ``no``).
    while (
        start > done
        and end - start < 64
        and ((c := text[start - 1]) in _KEY_CHARS or (c > "\x7f" and (c.isalpha() or c == "°")))
    ):
        start -= 1
    if start == end:
        return None
    key, label = text[start:end], None if sign else keys.label(text[start:end])
    if (sign or (start > 0 and text[start - 1] in SPACE_CHARS)) and (label is None or keys.ends_phrase(key)):
        first, in_words = _in_words(text, start, end, done, keys, sign)  # ``ID card:`` is no card's
        if in_words is not None:
            key, label = text[first:name_end], in_words
    if label == "address" and not quoted and text[at] == ":":
        key, label = _qualified(text, start, done, key, label, keys.label)
    if label is None:
        return None
    return Key(key, label, text[end : end + slashes + 1] if quoted else "", not quoted and end == at)


def _in_words(
    text: str, start: int, end: int, done: int, keys: KeyMatcher, sign: bool
) -> tuple[int, str | None]:
    """Where the key ending with the word ``text[start:end]`` (and a ``#`` after it, with
    ``sign``), written in words a space apart, starts, and its label
    (:meth:`KeyMatcher.label_of_words`): ``date of birth:``, ``Birth Date:``, ``zip code:`` were a
    word that named nothing (``birth``, ``date``, ``code``), and the value after them passed."""
    word = text[start:end]
    if not sign and not keys.ends_phrase(word):
        return start, None
    words, starts, at = [word], [start], start
    while len(words) <= keys.phrase_words and at - 1 > done and text[at - 1] in SPACE_CHARS:
        gap = space_run_start(text, at, done)
        before = _WORD_BEFORE.search(text, max(done, gap - 33), gap) if at - gap <= 4 else None
        if before is None:
            break
        written, at = before[0], before.start()
        if written in ("s", "S") and text[at - 1 : at] in _APOSTROPHES and at - 1 > done:
            owner = _WORD_BEFORE.search(text, max(done, at - 35), at - 1)  # ``driver's``: ``drivers``
            if owner is not None:
                written, at = f"{owner[0]}s", owner.start()
        words.insert(0, written)
        starts.insert(0, at)
    found = keys.label_of_words([*words, "no"] if sign else words)
    if found is None:
        return start, None
    width, label = found
    return starts[sign - width], label  # ``no`` for a ``#`` has no start of its own


def _qualified(
    text: str, start: int, done: int, key: str, label: str, label_for_key: Callable[[str], str | None]
) -> tuple[str, str]:
    """An address key before ``:`` read with the lower-case word written before it, one space
    apart, as its qualifier: ``email address:`` is an email key (pydantic's ``value is not a valid email
    address: An email address must have an @-sign.`` keeps its reason, no ``@`` in it), ``server
    address:`` a machine's; ``billing address:`` and ``new address:`` are still addresses. A
    capitalised word (``Email address:``, a field's label at a line's start) qualifies nothing."""
    word = _QUALIFIER.search(text, max(done, start - 37), start) if key.lower() in _ADDRESS_KEYS else None
    if word is None:
        return key, label
    qualified = f"{word[1]}_{key}"
    return qualified, label_for_key(qualified) or label
