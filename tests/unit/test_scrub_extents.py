"""How far a keyed number runs in free text, and what the reader of ``key=value`` text takes for
the scrubber's own output (review of the extents). A keyed number ends where its groups as
written end, not over the counts, status codes and epoch seconds after it
(:mod:`jobsystem.privacy.scrub_groups`); ``phone:`` and twelve digits is no hash of ours unless
the scrubber hashes; the repr of JSON text in a JSON string is read. Numbers grouped by no-break
spaces: ``KEYED_IN_GROUPS``; names with particles or in scripts without case:
``test_scrub_review_gaps``."""

from __future__ import annotations

import ast
import json

import pytest

from jobsystem.privacy.scrub import Scrubber
from tests.pii_corpus import AFTER_A_KEYED_NUMBER, KEYED_IN_GROUPS, KEYED_WORDS, leaks

scrub = Scrubber()
hashing = Scrubber(hash_key="a-test-key-of-32-characters-long")

#: Numbers in groups of at most four digits of a plan of many lengths: a group of two or three
#: digits after them leaves a valid number of the same country, so it is taken with them (a part
#: of a number kept is the worse mistake: ``030 1234 567`` is a number, ``030 1234`` one too).
_MANY_LENGTHS = {"+49 (0)30 1234 5678", "030 1234 567"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("phone: 0612345678 3 attempts", "phone: [phone] 3 attempts"),
        ("phone=0301234567 3 retries", "phone=[phone] 3 retries"),
        ("phone=+447700900123 200 300", "phone=[phone] 200 300"),
        ("phone: 555-0100 3 retries", "phone: [phone] 3 retries"),
        ("ssn: 078-05-1121 7 rows", "ssn: [ssn] 7 rows"),
        ("account_number: 12345678 1714557633", "account_number: [account] 1714557633"),
        ("card_id=42 3 retries", "card_id=[card] 3 retries"),
        # Valid with the group after them too (``+49 30 123456712``), but not so written.
        ("phone: +39 06 1234 5678 3 retries", "phone: [phone] 3 retries"),
        ("phone=+49 30 1234567 12 ms", "phone=[phone] 12 ms"),
        ("phone=+49 30 1234567 404", "phone=[phone] 404"),
    ],
)
def test_ordinary_numbers_after_a_keyed_number_stay(text, expected):
    assert scrub.text(text) == expected


@pytest.mark.parametrize("after", AFTER_A_KEYED_NUMBER)
@pytest.mark.parametrize(
    ("key", "label", "value"), [e for e in KEYED_IN_GROUPS + KEYED_WORDS if e[2] not in _MANY_LENGTHS]
)
def test_a_keyed_number_ends_before_the_ordinary_text_after_it(key, label, value, after):
    assert scrub.text(f"{key}: {value} {after}") == f"{key}: [{label}] {after}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("phone: 030 1234 567 ok", "phone: [phone] ok"),  # Germany's ``030 1234`` is valid too
        ("phone: +39 021 234 5678 ok", "phone: [phone] ok"),  # Italy's ``+39 021 234`` too
        ("phone: +44 7700 900 123 ok", "phone: [phone] ok"),  # grouped otherwise than formatted
        ("phone: 0612 345 678 ok", "phone: [phone] ok"),
        ("account_number: 12 3456 7890 ok", "account_number: [account] ok"),  # no check: its digits
        ("card: 4111 1111 1111 1112 ok", "card: [card] ok"),  # a digit off (Luhn fails), a card's groups
    ],
)
def test_a_keyed_number_grouped_otherwise_is_still_taken_whole(text, expected):
    assert scrub.text(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("tax number: 12 34 567 890 123", "tax number: [id_number]"),  # ``123`` was left
        ("tax_id=12 34 567 890 123 retried 3 times", "tax_id=[id_number] retried 3 times"),
        ("national_id: 1 85 05 78 006 084 37 ok", "national_id: [id_number] ok"),  # a NIR, a digit off
        ("account_number: 1234 5678 9012 3456 ok", "account_number: [account] ok"),
        ("tax_id: 12 34 567 890 3 retries", "tax_id: [id_number] 3 retries"),
        ("tax_id: 12 34 567 890 2026-11-02", "tax_id: [id_number] 2026-11-02"),
        ("account_number: 12 3456 7890 200 300", "account_number: [account] 200 300"),
    ],
)
def test_a_keyed_number_no_check_confirms_runs_on_over_the_groups_it_is_written_in(text, expected):
    """A number whole by its digits only (no check confirms it, so its length is a guess) took no
    group of fewer than four digits after it: ``tax number: 12 34 567 890 123`` kept ``123``. A
    group as long as the one before it, or that keeps the groups in a shape of its kind, is the
    number's; a count or a status code grouped otherwise is not."""
    assert scrub.text(text) == expected


def test_twelve_digits_after_a_label_are_a_value_unless_the_scrubber_hashes():
    """``phone:<12 hex digits>`` is the scrubber's own output only when it has a hash key; a secret
    is never hashed, so ``password:<12 hex digits>`` is never its output."""
    assert scrub.text("phone:447700900123 sent") == "phone:[phone] sent"
    assert scrub.text("password:a1b2c3d4e5f6 sent") == "password:[password] sent"
    assert hashing.text("password:a1b2c3d4e5f6 sent") == "password:[password] sent"
    own = hashing.text("phone: +44 20 7946 0958")
    assert hashing.text(own) == own  # its own output stays


@pytest.mark.parametrize(
    "record",
    [
        {"name": "Ana Lopez", "n": 1},
        {"full_name": 'José "Pepe" Pérez', "email": "ana.lopez@example.com"},
        {"customer": {"name": "Zoë Gómez"}, "tel": "0161 496 0000"},
    ],
)
def test_the_repr_of_json_text_inside_a_json_string_loses_the_whole_value(record):
    """Dramatiq's DecodeError logs a body as the repr of its bytes: each quote of JSON text in a
    JSON string is written after two backslashes (``\\\\"name\\\\": \\\\"Ana Lopez\\\\"``)."""
    body = repr(json.dumps({"payload": json.dumps(record)}).encode())
    out = scrub.text(body)
    for word in ("Lopez", "Pérez", "P\\\\\\\\u00e9rez", "Pepe", "ana.lopez", "G\\\\\\\\u00f3mez", "496"):
        assert word not in out, out
    assert json.loads(json.loads(ast.literal_eval(out))["payload"]) == scrub(record)
    assert scrub.text(out) == out
    assert leaks(out) == []


def test_the_repr_of_nested_json_text_hashes_as_the_value_alone():
    hashed = hashing({"name": "José Pérez"})["name"]
    body = repr(json.dumps({"payload": json.dumps({"name": "José Pérez"})}).encode())
    assert hashed in hashing.text(body)
