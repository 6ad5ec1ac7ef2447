"""A key joined to its value by a space, and a keyed value that fails its checks (review 3).

``ssn 078-05-1120`` passed: ``078-05-1120`` fails the SSN's checks (the number of a wallet's sample
card, which the SSA never issues), so the number finder left it, and a key followed by a space was
no key. A key that says what its value is decides; checks matter only for a value with no key.
``born 1985-03-12``, ``date of birth 12.03.1985`` and ``geboren am 12.03.1985`` passed too.
After a space a value is taken only when it reads as one (an identifier, a whole date): ordinary
sentences near those keys stay (``tests.pii_ordinary.NEAR_NEW_KEYS``).
"""

from __future__ import annotations

import pytest

from jobsystem.privacy.scrub import Scrubber
from tests.pii_ordinary import NEAR_NEW_KEYS, NEAR_SPACES_AND_DATES, NOT_KEYED_IN_WORDS

scrub = Scrubber()
hashing = Scrubber(hash_key="a-test-key-of-32-characters-long")

#: (text, expected): a value after its key and a space.
SPACED: list[tuple[str, str]] = [
    ("ssn 078-05-1120", "ssn [ssn]"),
    ("SSN 078-05-1120 on file", "SSN [ssn] on file"),
    ("social security number 078 05 1120, retried", "social security number [ssn], retried"),
    ("tax number 12 34 567 890 123", "tax number [id_number]"),
    ("passport X1234567 scanned", "passport [id_number] scanned"),
    ("Passport No. X1234567", "Passport No. [id_number]"),
    ("Passport # X1234567", "Passport # [id_number]"),
    ("customer phone number 555 0134 retried", "customer phone number [phone] retried"),
    ("card 4111 1111 1111 1112 declined", "card [card] declined"),
    ("born 1985-03-12", "born [birth_date]"),
    ("born on 12/03/1985 in Paris", "born on [birth_date] in Paris"),
    ("date of birth 12.03.1985", "date of birth [birth_date]"),
    ("geboren am 12.03.1985 in Köln", "geboren am [birth_date] in Köln"),
    ("Geburtsdatum 12.03.1985", "Geburtsdatum [birth_date]"),
]


@pytest.mark.parametrize(("text", "expected"), SPACED)
def test_a_value_after_its_key_and_a_space_is_removed(text, expected):
    assert scrub.text(text) == expected
    assert scrub.text(f"then {text}; status=ok") == f"then {expected}; status=ok"


#: (key, label, value): a value its key names that fails the checks of its kind.
FAILING_CHECKS: list[tuple[str, str, str]] = [
    ("ssn", "ssn", "078-05-1120"),
    ("SSN", "ssn", "078-05-1120"),
    ("social security number", "ssn", "219-09-9999"),
    ("card number", "card", "4111 1111 1111 1112"),
    ("tax_id", "id_number", "12345678901"),
    ("iban", "iban", "DE00 3704 0044 0532 0130 00"),
]


@pytest.mark.parametrize(("key", "label", "value"), FAILING_CHECKS)
def test_a_value_its_key_names_is_removed_though_its_checks_fail(key, label, value):
    for separator in (": ", "=", " ", " is "):
        line = f"{key}{separator}{value} retried"
        assert scrub.text(line) == f"{key}{separator}[{label}] retried", line


def test_a_value_that_fails_its_checks_with_no_key_before_it_stays():
    assert scrub.text("ssn checked: 078-05-1120") == "ssn checked: 078-05-1120"


def test_a_value_after_its_key_and_a_space_hashes_as_under_its_key():
    hashed = hashing({"ssn": "078-05-1120"})["ssn"]
    assert hashing.text("ssn 078-05-1120") == f"ssn {hashed}"
    assert hashing.text(f"ssn {hashed} 3 ok") == f"ssn {hashed} 3 ok"  # its own output stays
    born = hashing({"date_of_birth": "12.03.1985"})["date_of_birth"]
    assert hashing.text("date of birth 12.03.1985") == f"date of birth {born}"


@pytest.mark.parametrize("line", NEAR_NEW_KEYS + NEAR_SPACES_AND_DATES + NOT_KEYED_IN_WORDS)
def test_ordinary_text_after_a_word_and_a_space_stays(line):
    assert scrub.text(line) == line
    assert scrub.text(line.upper()) == line.upper()
