"""A phone number in international form that its plan finds possible but not valid (review 5).

``+44 7700 900123`` (the UK's drama range), ``+1 555 555 5555`` or ``+1 999 555 0143`` (no such
area code) passed in free text: ``phonenumbers`` knows no operator for their ranges, so they are
not valid, yet a ``+`` and a country code say they are a phone number as written, and a test
range today is a person's when it is allocated. Written with ``+``, a number of a length its
country's numbers have is taken; a national-form run of digits still needs a valid number (order
numbers and amounts look like one), and ordinary text with a ``+`` stays
(``tests.pii_ordinary.WITH_PLUS``).
"""

from __future__ import annotations

import phonenumbers
import pytest

from jobsystem.privacy.scrub import Scrubber
from tests.pii_corpus import leaks
from tests.pii_ordinary import WITH_PLUS

scrub = Scrubber()
hashing = Scrubber(hash_key="a-test-key-of-32-characters-long")

#: Possible but not valid numbers, in international form.
POSSIBLE: list[str] = [
    "+44 7700 900123",
    "+447700900123",
    "(+44) 7700 900123",
    "+1 555 555 5555",
    "+1 (999) 555-0143",
    "+19995550143",
]


@pytest.mark.parametrize("number", POSSIBLE)
def test_the_numbers_are_possible_but_not_valid(number):
    """The premise: were they valid, the old code would have taken them."""
    parsed = phonenumbers.parse(number, None)
    assert phonenumbers.is_possible_number(parsed) and not phonenumbers.is_valid_number(parsed)


@pytest.mark.parametrize("number", POSSIBLE)
def test_a_possible_number_in_international_form_is_removed_in_free_text(number):
    out = scrub.text(f"customer called from {number} twice, order 73905561427")
    assert out == "customer called from [phone] twice, order 73905561427"
    assert leaks(out) == [] and scrub.text(out) == out


def test_a_possible_number_hashes_the_same_however_it_is_grouped():
    assert (
        hashing.text("+44 7700 900123") == hashing.text("+447700900123") == hashing.text("(+44) 7700 900123")
    )
    assert hashing.text("+1 999 555 0143") == hashing.text("+1 (999) 555-0143")


def test_a_possible_number_takes_no_count_after_it():
    """Windows of groups are tried longest first: a count after the number would make it too long."""
    assert scrub.text("call +1 999 555 0143 3 times") == "call [phone] 3 times"
    assert scrub.text("sms +44 7700 900123 2 retries") == "sms [phone] 2 retries"
    assert scrub.text("call +39 06 1234 5678 12 times") == "call [phone] 12 times"  # valid, preferred


@pytest.mark.parametrize(
    "text",
    [
        "9995550143",  # national form, not valid: an order number as often as a phone
        "999 555 0143",
        "+1 555 0143",  # a length the US dials only locally: no one writes it after a country code
        "+999 1234 5678",  # no country code
        "+44 12",
    ],
)
def test_other_numbers_that_are_not_valid_stay(text):
    assert scrub.text(f"ref {text} ok") == f"ref {text} ok"


@pytest.mark.parametrize("line", WITH_PLUS)
def test_ordinary_text_with_a_plus_stays(line):
    assert scrub.text(line) == line
