"""Which of the groups after a keyed number's first word are the number's (``phone: 0161 496 0000 3 times``).

After a key naming a phone, card, IBAN, national or account number, :mod:`scrub_extents` collects
the groups that follow the value's first word (``0161``, then ``496``, ``0000``, ``3``). Taking the
longest run that passes the number's checks, or every group when none does, took counts, ports,
status codes and epoch seconds with the number (``phone=+49 30 1234567 404``: Germany's numbers
vary in length, ``+49 30 1234567404`` is valid too). Now the value runs:

1. as far as the longest run that passes its kind's checks *and* is written in its kind's groups:
   a phone number grouped as libphonenumber formats it, nationally or internationally, or with a
   group of it split evenly (``+49 30 1234 5678``); a card in 4-4-4-4, 4-6-5 or 4-6-4; an IBAN in
   groups of four; an SSN in 3-2-4; a national number in its country's groups (:data:`SHAPES`);
   or its first word alone, if that passes the checks (``phone: 0612345678 3 attempts``);
2. else over the groups that fit a number in groups (2-8 digits, one after a ``+`` country code;
   no date; an IBAN's groups of up to four; a card's or an SSN's as they begin one of their
   shapes), never longer than any number of its kind, until it is complete: it passes its checks
   (a phone number: :func:`_complete`), has the digits a whole number of its kind has
   (:data:`_COMPLETE`), or an IBAN its country's length.

After a complete number, a group is taken only if the number with it passes the checks too, and
it has four digits or more, or two or three after a phone number in groups of up to four
(:func:`_continues`). A group of one digit, or of nine and more, is never taken after one: a
count, a status code or an epoch after a number stays (``card_id=42 3 retries``,
``phone=+49 30 1234567 404``). But a number whole by its digits only (no check confirms it, so its
length is a guess) also takes a group as long as the group before it, or one that keeps its
groups in a shape of its kind (:func:`_grouped_on`): ``tax number: 12 34 567 890 123`` kept ``123``.
"""

from __future__ import annotations

import re
from functools import lru_cache

import phonenumbers
from stdnum import iban as stdnum_iban

from jobsystem.privacy.scrub_numbers import NumberFinder

__all__ = ["SHAPES", "run_end"]

#: Digit groups a number of each kind is written in (lengths, first word included).
SHAPES: dict[str, frozenset[tuple[int, ...]]] = {
    "card": frozenset({(4, 4, 4, 4), (4, 4, 4, 4, 3), (4, 6, 5), (4, 6, 4)}),
    "ssn": frozenset({(3, 2, 4)}),
    "id_number": frozenset(
        {
            (2, 3, 3, 3),  # German IdNr
            (1, 2, 2, 2, 3, 3, 2),  # French NIR
            (3, 3, 4),  # UK NHS
            (4, 4, 4),  # Indian Aadhaar
            (3, 3, 3),  # Canadian SIN, Australian TFN, Dutch BSN
            (3, 2, 4),  # US SSN
            (6, 4),  # Swedish personnummer
            (8, 4),  # the same with the century
            (6, 5),  # Norwegian fødselsnummer
            (6, 7),  # Korean RRN
            (3, 3, 3, 2),  # Brazilian CPF
        }
    ),
}
#: Kinds written in their groups only: a run that begins none of them is no such number in groups
#: (``card_id=42 404``).
_WRITTEN_ONE_WAY = frozenset({"card", "ssn"})
#: Digits (an IBAN: letters and digits) at which a number that no check confirms is complete.
#: A phone number's: nine without a country code or trunk ``0`` (Spain's, Australia's mobiles
#: without it; ``3123 456 789`` is no number and 789), ten with one.
_COMPLETE = {"phone": 9, "card": 13, "ssn": 9, "id_number": 9, "account": 8, "iban": 34}
_COMPLETE_PREFIXED_PHONE = 10
#: Digits (an IBAN: letters and digits) no number of the kind goes past.
_LONGEST = {"phone": 17, "card": 19, "ssn": 9, "id_number": 18, "account": 24, "iban": 34}
_GROUP = re.compile(r"\d+")
#: A date after the number (``2026-11-02``, ``02/11/2026``), not a group of it.
_DATE = re.compile(r"\s+(?:\d{4}([\-/])\d\d?\1\d\d?|\d\d?([\-/])\d\d?\2\d{4})")
_ALNUM = re.compile(r"[0-9A-Za-z]")
_IBAN_WRITTEN = re.compile(r"[A-Za-z]{2}\d\d(?: [0-9A-Za-z]{4})*(?: [0-9A-Za-z]{1,4})?")


def run_end(numbers: NumberFinder, label: str, text: str, begin: int, ends: list[int]) -> int:
    """Where a ``label`` value that begins at ``begin`` ends: at one of ``ends``, the end of its
    first word (``ends[0]``) and of each group after it (see the module)."""
    runs = [text[begin:end] for end in ends]
    written = next((last for last in range(len(runs) - 1, 0, -1) if _written(numbers, label, runs[last])), 0)
    if written == len(runs) - 1:
        return ends[written]  # nothing after it to walk over
    complete = written > 0 or numbers.confirms(label, runs[0])
    return ends[_walk(numbers, label, runs, written, complete)]


def _written(numbers: NumberFinder, label: str, run: str) -> bool:
    """Whether ``run`` is written in its kind's groups and passes its kind's checks."""
    if label == "phone":
        return bool(_phone_countries(numbers, run)[0])
    if label == "iban":
        return bool(_IBAN_WRITTEN.fullmatch(run)) and numbers.confirms(label, run)
    shapes = SHAPES.get(label, frozenset())
    return tuple(len(g) for g in _GROUP.findall(run)) in shapes and numbers.confirms(label, run)


def _walk(numbers: NumberFinder, label: str, runs: list[str], last: int, complete: bool) -> int:
    """The index of the last run of the value, walking on from ``runs[last]`` over the groups that
    fit a number in groups: up to the first complete run, then only over those that continue it
    (:func:`_continues`; ``+39 021 234 5678``: Italy's ``+39 021 234`` is valid too)."""
    count = _count(label, runs[last])
    enough = _COMPLETE.get(label, _COMPLETE["account"])
    if label == "phone" and runs[0].startswith(("+", "(", "0")):
        enough = _COMPLETE_PREFIXED_PHONE
    confirmed = complete  # whole by its checks: a group after it must pass them too
    if not complete and _complete(numbers, label, runs[last], count, enough):
        complete, confirmed = True, count < enough
    while last + 1 < len(runs):
        size = _count(label, runs[last + 1]) - count
        if not _fits(label, runs, last, size) or count + size > _LONGEST.get(label, _LONGEST["account"]):
            break
        if complete and not (
            (not confirmed and _grouped_on(label, runs[last + 1]))
            or _continues(numbers, label, runs[last], runs[last + 1], size)
        ):
            break
        last, count = last + 1, count + size
        if not complete and _complete(numbers, label, runs[last], count, enough):
            complete, confirmed = True, count < enough  # whole by its checks, or by its digits only
    return last


def _grouped_on(label: str, longer: str) -> bool:
    """Whether the last group of ``longer`` goes on grouping a number of ``label`` that is whole by
    its digits only (no check confirms it, so its length is a guess): a national, account or card
    number whose groups are still those of a shape of its kind (``1 85 05 78 006 084 36``, a
    French NIR with a typo), or that is as long as the group before it (``12 34 567 890 123``:
    its ``123`` was left). A count after it is grouped otherwise (``12 3456 7890 200 300``)."""
    if label in ("phone", "iban"):
        return False  # a phone's groups are its plan's (:func:`_continues`), an IBAN's fours
    groups = tuple(len(g) for g in _GROUP.findall(longer))
    if len(groups) > 1 and groups[-1] == groups[-2]:
        return True
    return any(shape[: len(groups)] == groups for shape in SHAPES.get(label, ()))


def _continues(numbers: NumberFinder, label: str, run: str, longer: str, size: int) -> bool:
    """Whether the group of ``size`` digits that makes ``longer`` of a complete ``run`` is still the
    number's: ``longer`` passes its checks too (a phone number: as a number of the country ``run``
    is valid in, written as that country writes it if it is: ``06 12 34 56 78`` is French, though
    Germany reads it too), and the group has four digits or more, or (a phone number in groups of
    at most four) two or three: a plan of many lengths cannot tell ``030 1234 567`` from
    ``030 1234`` and 567, and a part of a number kept is the worse mistake."""
    if label != "phone":
        return size >= 4 and numbers.confirms(label, longer)
    written, valid = _phone_countries(numbers, run)
    if not (written or valid) & _phone_countries(numbers, longer)[1]:
        return False
    return size >= 4 or len(_GROUP.findall(run)[-1]) <= 4


def _fits(label: str, runs: list[str], last: int, size: int) -> bool:
    """Whether the group of ``size`` digits after ``runs[last]`` may be a group of its number."""
    if label == "iban":
        return size <= 4
    if not (2 <= size <= 8 or (size == 1 and last == 0 and runs[0].startswith("+"))):
        return False
    if _DATE.fullmatch(runs[last + 1], len(runs[last])):
        return False
    if label not in _WRITTEN_ONE_WAY:
        return True
    groups = tuple(len(g) for g in _GROUP.findall(runs[last + 1]))
    return any(shape[: len(groups)] == groups for shape in SHAPES[label])


def _complete(numbers: NumberFinder, label: str, run: str, count: int, enough: int) -> bool:
    """Whether ``run`` (of ``count`` digits) is a whole number already: no group after it is its.
    A phone number is whole by its digits only: in a plan of many lengths (Italy's, Germany's,
    China's) the first groups of a number oddly grouped are valid too (``+39 0212 345`` of
    ``+39 0212 345 678``); grouped as its plan writes it, it was taken whole before the walk."""
    if count >= enough:
        return True
    if label == "iban":
        return _iban_length(run)
    return label != "phone" and numbers.confirms(label, run)


def _iban_length(run: str) -> bool:
    """Whether ``run`` has its country's IBAN length (valid, or wrong only in its check digits).
    Judged with the check digits it should have: ``stdnum`` tests them before the length, so
    ``DE00`` alone, wrong in them, passed for a whole IBAN and its other groups were left."""
    try:
        compact = stdnum_iban.compact(run)
        stdnum_iban.validate(compact[:2] + stdnum_iban.calc_check_digits(compact) + compact[4:])
    except Exception:  # another length, format or country: not a whole IBAN
        return False
    return True


def _count(label: str, run: str) -> int:
    """Digits in ``run``; for an IBAN letters and digits."""
    return len(_ALNUM.findall(run)) if label == "iban" else sum(len(g) for g in _GROUP.findall(run))


@lru_cache(maxsize=1024)
def _phone_countries(numbers: NumberFinder, run: str) -> tuple[frozenset[int | None], frozenset[int | None]]:
    """The country codes of the valid phone numbers ``run`` reads as: those it is written as
    libphonenumber formats (:func:`_grouped_as_formatted`), and all of them."""
    readings = numbers.phones(run)
    written = frozenset(n.country_code for n in readings if _grouped_as_formatted(n, run))
    return written, frozenset(n.country_code for n in readings)


def _grouped_as_formatted(number: phonenumbers.PhoneNumber, written: str) -> bool:
    """Whether the groups of ``written``, a valid ``number``, are those libphonenumber writes it
    in, nationally or internationally, each of them whole or split evenly (``+49 30 1234 5678`` for
    ``+49 30 12345678``; ``1234567 12`` is no split of ``123456712``).
    The country code, an international prefix and a trunk ``0``, ``(0)`` too, are not compared."""
    significant = phonenumbers.national_significant_number(number)
    groups = _significant_groups(written, significant)
    if groups is None:
        return False
    for style in (phonenumbers.PhoneNumberFormat.NATIONAL, phonenumbers.PhoneNumberFormat.INTERNATIONAL):
        formatted = _significant_groups(phonenumbers.format_number(number, style), significant)
        if formatted is not None and _splits(groups, formatted):
            return True
    return False


def _significant_groups(text: str, significant: str) -> list[int] | None:
    """The lengths of the digit groups of ``text`` over its national significant number (its last
    digits), or None if its digits do not end with it."""
    groups = _GROUP.findall(text)
    if not "".join(groups).endswith(significant):
        return None
    lengths = [len(group) for group in groups]
    extra = sum(lengths) - len(significant)
    while extra:
        cut = min(extra, lengths[0])
        lengths[0] -= cut
        extra -= cut
        if not lengths[0]:
            lengths.pop(0)
    return lengths


def _splits(written: list[int], formatted: list[int]) -> bool:
    """Whether ``written`` is ``formatted`` with some groups split evenly (:func:`_even`)."""
    at = 0
    for size in formatted:
        pieces: list[int] = []
        while sum(pieces) < size and at < len(written):
            pieces.append(written[at])
            at += 1
        if sum(pieces) != size or (len(pieces) > 1 and not _even(pieces)):
            return False
    return at == len(written)


def _even(pieces: list[int]) -> bool:
    """Whether a group split into ``pieces`` is split as people split one: into pieces of 2-5
    digits, all of one length but the first, which may be shorter (``1234 5678``, ``12 345 678``;
    not ``1234567 12``, a number and a count)."""
    first, *rest = pieces
    return all(piece == rest[0] for piece in rest) and 2 <= first <= rest[0] <= 5
