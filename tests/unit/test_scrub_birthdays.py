"""A date of birth without its year after its key (review 5).

``born 12 March``, ``born on March 12th``, ``birthday: 12 March``, ``DOB 12/03`` and ``date of
birth: 12.03.`` were kept: a key joined to its value by a space was looked for only in a text with
five digits close together or a year, a day of one digit was not looked at after a key and a
space (``born 1 March 1985`` passed too), and a day and a month in digits were no date's shape. A day
and a month are enough to find a person (with a name, a city), so after a key of a date of birth
they are one. The same words without such a key stay (``tests.pii_ordinary.NEAR_BIRTHDAYS``).
"""

from __future__ import annotations

import pytest

from jobsystem.privacy.scrub import Scrubber
from tests.pii_ordinary import NEAR_BIRTHDAYS

scrub = Scrubber()
hashing = Scrubber(hash_key="a-test-key-of-32-characters-long")

#: (text, expected): a day and a month after a key of a date of birth, in its languages.
WITHOUT_YEAR: list[tuple[str, str]] = [
    ("born 12 March", "born [birth_date]"),
    ("born on March 12th", "born on [birth_date]"),
    ("birthday: 12 March", "birthday: [birth_date]"),
    ("DOB 12/03", "DOB [birth_date]"),
    ("dob 3/25", "dob [birth_date]"),
    ("date of birth: 12.03.", "date of birth: [birth_date]"),
    ("date of birth 12.03.", "date of birth [birth_date]"),
    ("Date of Birth 12 March", "Date of Birth [birth_date]"),
    ("birthday 12th of March", "birthday [birth_date]"),
    ("born\u00a012\u00a0March", "born\u00a0[birth_date]"),
    ("geboren am 12.03.", "geboren am [birth_date]"),
    ("Geburtsdatum: 12. März", "Geburtsdatum: [birth_date]"),
    ("Geburtsdatum 12. März", "Geburtsdatum [birth_date]"),
    ("date de naissance 12 mars", "date de naissance [birth_date]"),
    ("fecha de nacimiento 12 de marzo", "fecha de nacimiento [birth_date]"),
    ("data di nascita 12 marzo", "data di nascita [birth_date]"),
    ("geboortedatum 12 maart", "geboortedatum [birth_date]"),
    # A day of one digit: no two digits close together, which a key and a space were looked for before.
    ("born 1 March", "born [birth_date]"),
    ("born 1st of March 1985", "born [birth_date]"),
    ("geboren am 1. März", "geboren am [birth_date]"),
    ("date de naissance 1er mars", "date de naissance [birth_date]"),
]


@pytest.mark.parametrize(("text", "expected"), WITHOUT_YEAR)
def test_a_day_and_a_month_after_a_key_of_a_date_of_birth_are_removed(text, expected):
    assert scrub.text(text) == expected
    assert scrub.text(f"Ana, {text}, status=ok") == f"Ana, {expected}, status=ok"
    assert scrub.text(expected) == expected


def test_a_date_of_birth_without_its_year_ends_where_its_shape_does():
    """The words after it stay, as after a whole date (``dob: 12/03`` ran to the line's end)."""
    assert scrub.text("dob: 12/03 retried 3 times") == "dob: [birth_date] retried 3 times"
    assert scrub.text("born 12 March in Paris") == "born [birth_date] in Paris"


def test_a_date_of_birth_without_its_year_hashes_as_under_its_key():
    hashed = hashing({"dob": "12/03"})["dob"]
    assert hashing.text("DOB 12/03") == f"DOB {hashed}"


@pytest.mark.parametrize("line", NEAR_BIRTHDAYS)
def test_a_day_and_a_month_without_a_key_of_a_date_of_birth_stay(line):
    assert scrub.text(line) == line
    assert scrub.text(line.upper()) == line.upper()
