"""What a phone number's reading must be beyond valid in its plan, or instead of it, to be taken in
free text.

- Read without the trunk ``0`` of a region that has one, it must be written as the region writes
  it (:func:`as_written`): any other grouping is an amount or a reference as often as not.
- Written with ``+`` and a country code, a number its plan finds possible but not valid (a range
  not allocated yet: the UK's drama numbers ``+44 7700 900123``, ``+1 555 555 5555``) is a phone
  number as written (:func:`possible_length`): the ``+`` says so, and a test range today may be a
  person's tomorrow. Without the ``+`` a possible number is a run of digits like any other.
"""

from __future__ import annotations

import re

import phonenumbers

__all__ = ["as_written", "possible_length"]

_GROUP = re.compile(r"\d+")
_IS_POSSIBLE = phonenumbers.ValidationResult.IS_POSSIBLE


def as_written(number: phonenumbers.PhoneNumber, formatted: str) -> bool:
    """Whether a valid ``number``, read without a trunk 0 in a region that has one, is written
    (``formatted``) as the region writes it: its national format has no 0 either (``0113 456 7890``
    in the UK, but ``(11) 3456-7890`` in Brazil, ``138 0013 8000`` for a Chinese mobile) and has
    the same groups of digits. Any other grouping is an amount or a reference as often as not:
    ``4 579 102 298`` or ``183 778 3533`` are valid Brazilian numbers, written ``(45) 7910-2298``."""
    national = phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.NATIONAL)
    groups = [len(group) for group in _GROUP.findall(formatted)]
    return not national.lstrip("(").startswith("0") and groups == [len(g) for g in _GROUP.findall(national)]


def possible_length(number: phonenumbers.PhoneNumber) -> bool:
    """Whether ``number``, written with ``+`` and its country code, has a length its country's
    numbers have: a number in a range not allocated yet (``+44 7700 900123``, ``+1 999 555 0143``)
    is no valid one but still a person's as written. A length only dialled locally (the US's 7
    digits) is none: no one writes a local number after a country code."""
    return phonenumbers.is_possible_number_with_reason(number) == _IS_POSSIBLE
