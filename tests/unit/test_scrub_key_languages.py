"""Keys of personal numbers and dates of birth in the product's other languages (review 3).

``Personalausweisnummer: L01X00T47``, ``numéro de sécurité sociale: 1 85 05 78 006 084 36``,
``pasaporte: PAA123456``, ``paspoortnummer: NXC1P7L21`` passed: no key of another language than
English was known but ``codice fiscale``, ``BSN``, ``NIE``, ``DNI`` and ``NIR``, and a word with an
accent (``numéro``, ``sécurité``) ended the words of a key. ``id card number: AB123456`` became
``[card]``: an identity card's number is an id number, not a payment card's.
"""

from __future__ import annotations

import pytest

from jobsystem.privacy.scrub import Scrubber
from jobsystem.privacy.scrub_keys import tokens
from tests.pii_ordinary import NEAR_NEW_KEYS

scrub = Scrubber()
hashing = Scrubber(hash_key="a-test-key-of-32-characters-long")

#: (key, label, value): a key of another language, or of an identity card, and a value of its kind.
KEYS_IN_LANGUAGES: list[tuple[str, str, str]] = [
    ("Personalausweis", "id_number", "L01X00T47"),
    ("Personalausweisnummer", "id_number", "L01X00T47"),
    ("Ausweisnummer", "id_number", "T22000129"),
    ("Reisepass", "id_number", "C01X00T47"),
    ("Reisepass Nummer", "id_number", "C01X00T47"),
    ("Steuer-ID", "id_number", "12 345 678 903"),
    ("Steueridentifikationsnummer", "id_number", "12345678903"),
    ("numéro de sécurité sociale", "id_number", "1 85 05 78 006 084 36"),
    ("NIR", "id_number", "1 85 05 78 006 084 36"),
    ("numéro INSEE", "id_number", "185057800608436"),
    ("passeport", "id_number", "12AB34567"),
    ("numéro de passeport", "id_number", "12AB34567"),
    ("pasaporte", "id_number", "PAA123456"),
    ("NIE", "id_number", "X1234567L"),
    ("DNI", "id_number", "12345678Z"),
    ("codice fiscale", "id_number", "RSSMRA85T10A562S"),
    ("BSN", "id_number", "1112.22.333"),
    ("paspoortnummer", "id_number", "NXC1P7L21"),
    ("id card number", "id_number", "AB123456"),
    ("ID card", "id_number", "AB123456"),
    ("identity card no", "id_number", "AB123456"),
]


@pytest.mark.parametrize(("key", "label", "value"), KEYS_IN_LANGUAGES)
def test_a_number_after_its_key_in_another_language_is_removed_whole(key, label, value):
    for separator in (": ", "=", " is "):
        for written in (key, key.lower(), key.upper()):
            line = f"{written}{separator}{value} retried"
            assert scrub.text(line) == f"{written}{separator}[{label}] retried", line
    assert scrub.text(f'{{"{key}": "{value}", "n": 1}}') == f'{{"{key}": "[{label}]", "n": 1}}'
    assert scrub({key: value}) == {key: f"[{label}]"}


@pytest.mark.parametrize(("key", "label", "value"), KEYS_IN_LANGUAGES)
def test_a_number_after_its_key_in_another_language_hashes_as_under_its_key(key, label, value):
    assert hashing.text(f"{key}: {value}") == f"{key}: {hashing({key: value})[key]}"


def test_an_identity_cards_number_is_labelled_as_the_other_id_numbers():
    assert scrub.text("id card number: AB123456") == "id card number: [id_number]"
    assert scrub({"id_card_number": "AB123456", "identityCard": "AB123456"}) == {
        "id_card_number": "[id_number]",
        "identityCard": "[id_number]",
    }
    assert scrub.text("credit card number: 4111 1111 1111 1112") == "credit card number: [card]"


def test_accents_are_folded_in_key_names():
    assert tokens("numéroDeSécuritéSociale") == ("numero", "de", "securite", "sociale")
    assert tokens("N\u0303u\u0301m") == ("num",)  # decomposed accents too
    assert scrub({"numéro_de_passeport": "12AB34567"}) == {"numéro_de_passeport": "[id_number]"}


@pytest.mark.parametrize("line", NEAR_NEW_KEYS)
def test_ordinary_text_near_the_new_keys_stays(line):
    assert scrub.text(line) == line
