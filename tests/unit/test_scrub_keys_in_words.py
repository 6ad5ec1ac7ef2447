"""Keys of personal numbers written in words in free text: ``passport number: X1234567``.

``date of birth:`` was read as a key, but ``phone number:``, ``passport number:``, ``social
security number:``, ``driver's licence number:`` and the like were the word ``number`` before a
colon, which names nothing: a number in a shape the finders take went by its shape, any other
(a passport with letters, another country's ID or tax number) passed.
"""

from __future__ import annotations

import pytest

from jobsystem.privacy.scrub import Scrubber
from jobsystem.privacy.scrub_keys import KeyMatcher
from tests.pii_corpus import KEYED_IN_WORDS, leaks
from tests.pii_ordinary import NOT_KEYED_IN_WORDS

scrub = Scrubber()
hashing = Scrubber(hash_key="a-test-key-of-32-characters-long")

#: The key of a structure whose value hashes as a value of each label does.
KEY_OF = {"account": "account_number"}

#: How a key in words is written before its value: the separators the key reader takes (``is`` as
#: the key is written: ``PASSPORT NUMBER IS``, ``Passport Number Is``).
SEPARATORS = [": ", ":", "=", " = ", " is ", " IS ", " Is "]


@pytest.mark.parametrize("separator", SEPARATORS)
@pytest.mark.parametrize(("key", "label", "value"), KEYED_IN_WORDS)
def test_a_personal_number_after_its_key_in_words_is_removed(key, label, value, separator):
    for written in (key, key.lower(), key.upper(), key.title()):
        line = f"{written}{separator}{value} retried"
        assert scrub.text(line) == f"{written}{separator}[{label}] retried", line
    assert leaks(scrub.text(f"then {key}{separator}{value}; status=ok")) == []


@pytest.mark.parametrize(("key", "label", "value"), KEYED_IN_WORDS)
def test_a_key_in_words_is_a_key_quoted_and_hashes_as_under_its_key(key, label, value):
    assert scrub.text(f'{{"{key}": "{value}", "n": 1}}') == f'{{"{key}": "[{label}]", "n": 1}}'
    field = KEY_OF.get(label, label)
    under_key = hashing({field: value})[field]
    assert hashing.text(f"{key}: {value}") == f"{key}: {under_key}"


@pytest.mark.parametrize("line", NOT_KEYED_IN_WORDS)
def test_an_operations_number_or_a_remark_after_words_stays(line):
    assert scrub.text(line) == line
    assert scrub.text(line.upper()) == line.upper()


def test_only_a_numbers_name_before_number_makes_a_key():
    """``number`` ends a key in words after a name whose values are numbers (a phone, an ID), and
    counts with it; after any other word it names nothing."""
    keys = KeyMatcher()
    assert keys.label_of_words(["customer", "phone", "number"]) == (2, "phone")
    assert keys.label_of_words(["his", "social", "security", "no"]) == (3, "ssn")
    assert keys.label_of_words(["drivers", "license", "number"]) == (3, "id_number")
    assert keys.label_of_words(["credit", "card", "number"]) == (2, "card")  # ``card_number``
    for words in (["order", "number"], ["retry", "number"], ["email", "number"], ["password", "no"]):
        assert keys.label_of_words(words) is None, words


@pytest.mark.parametrize(
    "key",
    ["Passport No.", "passport no.", "Passport Nr.", "Passport #", "passport #", "Passport#", "Ausweis-Nr."],
)
def test_an_abbreviated_number_word_or_a_number_sign_ends_a_key_in_words(key):
    """``Passport No.:`` and ``Passport #:`` were a ``.`` or a ``#`` before the separator: no key."""
    for separator in (": ", ":", " = "):
        line = f"{key}{separator}X1234567 retried"
        assert scrub.text(line) == f"{key}{separator}[id_number] retried", line


@pytest.mark.parametrize("written", ["is", "IS", "Is", "iS"])
def test_is_in_any_case_separates_a_key_in_words_or_a_one_word_key_of_a_number(written):
    """``PASSPORT NUMBER iS X1234567`` passed (``iS`` was not looked for), and so did ``passport is
    X1234567``: only a key in words was read before `` is ``."""
    for key, label, value in (
        ("PASSPORT NUMBER", "id_number", "X1234567"),
        ("passport", "id_number", "X1234567"),
        ("ssn", "ssn", "219-09-9999"),
        ("password", "password", "hunter22"),
        ("dob", "birth_date", "1985-03-12"),
    ):
        line = f"{key} {written} {value} on file"
        assert scrub.text(line) == f"{key} {written} [{label}] on file", line


@pytest.mark.parametrize(
    "line",
    ["address is 10.0.0.5", "name is A1 in the list", "email is 42 chars", "ip is 81.2.69.142 now"],
)
def test_is_after_a_one_word_key_of_another_kind_joins_nothing(line):
    """`` is `` after a one-word key of an address, a name, an email or an IP is a remark: a
    machine's address stays, a public IP goes by its shape only."""
    expected = line.replace("81.2.69.142", "[ip]")
    assert scrub.text(line) == expected
