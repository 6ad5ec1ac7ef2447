"""The scrubber on its own: the whole corpus is removed, ordinary values of a job system pass."""

from __future__ import annotations

import logging
import re
import sys

import pytest

from middleware.scrub import Scrubber
from tests.pii_corpus import BY_KEY, BY_PATTERN, ORDINARY, SECRETS, free_text, keyed, leaks

scrub = Scrubber()
hashing = Scrubber(hash_key="a-test-key-of-32-characters-long")


@pytest.mark.parametrize(("label", "value"), BY_PATTERN)
def test_value_found_by_pattern_is_replaced_wherever_it_sits(label, value):
    assert scrub.text(f"contact {value}, thanks") == f"contact [{label}], thanks"
    assert scrub.text(value) == f"[{label}]"
    assert scrub.text(f"({value})") == f"([{label}])"


@pytest.mark.parametrize(("replacement", "text", "secret"), SECRETS)
def test_secret_found_by_pattern_is_replaced(replacement, text, secret):
    assert scrub.text(f"sent {text} today") == f"sent {replacement} today"


@pytest.mark.parametrize(("key", "label", "value"), BY_KEY)
def test_value_under_a_sensitive_key_is_replaced_at_any_depth(key, label, value):
    nested = {"job": {"items": [{"customer": ({key: value},)}]}}
    assert scrub(nested) == {"job": {"items": [{"customer": ({key: f"[{label}]"},)}]}}


@pytest.mark.parametrize(("key", "label", "value"), BY_KEY)
def test_sensitive_key_named_in_free_text_loses_its_value(key, label, value):
    text = str(value)
    assert scrub.text(f"{key}={text!r} and more") == f"{key}='[{label}]' and more"
    assert scrub.text(f'{{"{key}": "{text}", "n": 1}}') == f'{{"{key}": "[{label}]", "n": 1}}'
    assert scrub.text(f"{key}: {text}") == f"{key}: [{label}]" or " " in text


@pytest.mark.parametrize("value", ORDINARY)
def test_ordinary_values_pass_unchanged(value):
    assert scrub.text(value) == value
    assert scrub({"value": value, "order_id": value}) == {"value": value, "order_id": value}


@pytest.mark.parametrize(
    "key",
    ["actor_name", "queue_name", "template_name", "message_id", "order_id", "amount", "port", "discard"],
)
def test_ordinary_keys_keep_their_values(key):
    assert scrub({key: "Ana Lopez"}) == {key: "Ana Lopez"}


def test_whole_corpus_in_one_text_and_one_record_leaves_nothing():
    assert leaks(scrub.text(free_text())) == []
    assert leaks(repr(scrub(keyed()))) == []
    assert leaks(repr(hashing(keyed()))) == [] and leaks(hashing.text(free_text())) == []


def test_hash_key_gives_a_stable_keyed_hash_for_personal_data_only():
    first = hashing.text("mail Ana.Lopez@Example.com now")
    assert re.fullmatch(r"mail email:[0-9a-f]{12} now", first)
    # One person, one hash: in free text, under a key, whatever the case.
    assert hashing.text("ana.lopez@example.com") == first.split()[1]
    assert hashing({"email": "ana.lopez@example.com"})["email"] == first.split()[1]
    # Same number in two formats, same hash; another key, another hash.
    assert hashing.text("4111 1111 1111 1111") == hashing.text("4111-1111-1111-1111")
    other = Scrubber(hash_key="another-key-of-32-characters-long")
    assert other.text("ana.lopez@example.com") != first.split()[1]
    # Secrets are never hashed.
    assert hashing({"password": "hunter2", "api_key": "x" * 20}) == {
        "password": "[password]",
        "api_key": "[secret]",
    }
    assert hashing.text("Bearer abcdefgh12345678") == "Bearer [token]"


@pytest.mark.parametrize("scrubber", [scrub, hashing])
def test_scrubbing_twice_changes_nothing_more(scrubber):
    once = scrubber.text(free_text())
    assert scrubber.text(once) == once
    record = scrubber(keyed())
    assert scrubber(record) == record
    assert scrubber.text(repr(record)) == repr(record)


def test_extra_keys_are_configurable():
    custom = Scrubber(extra_keys=["loyalty_id", "Customer-Ref"])
    assert custom({"loyalty_id": "L-123", "customerRef": "C-9", "loyalty_tier": "gold"}) == {
        "loyalty_id": "[redacted]",
        "customerRef": "[redacted]",
        "loyalty_tier": "gold",
    }
    assert custom.text("customer_ref=C-9") == "customer_ref=[redacted]"
    assert scrub({"loyalty_id": "L-123"}) == {"loyalty_id": "L-123"}


def test_invalid_numbers_are_not_personal_data():
    assert scrub.text("4111 1111 1111 1112") == "4111 1111 1111 1112"  # fails the Luhn check
    assert scrub.text("DE89 3704 0044 0532 0130 01") == "DE89 3704 0044 0532 0130 01"  # fails mod 97
    assert scrub.text("000-12-3456") == "000-12-3456"  # never issued


def test_odd_input_never_raises():
    cycle: dict[str, object] = {"email": "a@b.example"}
    cycle["self"] = cycle
    assert scrub(cycle) == {"email": "[email]", "self": "[cycle]"}
    assert scrub(b"\xff\xfe bytes to ana.lopez@example.com") == "\ufffd\ufffd bytes to [email]"
    assert scrub(bytearray(b"x@example.org")) == "[email]"

    class Hostile:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    assert scrub([Hostile()]) == ["<Hostile>"]
    deep: list[object] = []
    node = deep
    for _ in range(sys.getrecursionlimit() + 10):
        node.append([])
        node = node[0]
    assert "[too deep]" in repr(scrub(deep))
    assert scrub({1: "ana.lopez@example.com", None: 2.5, ("t",): {3}}) == {
        1: "[email]",
        None: 2.5,
        ("t",): [3],
    }
    assert scrub(ValueError("for ana.lopez@example.com")) == "ValueError: for [email]"


def test_huge_strings_are_truncated_and_scrubbed():
    huge = ("ana.lopez@example.com " * 10_000) + "x" * 100_000
    out = Scrubber(max_length=50_000).text(huge)
    assert len(out) < 60_000 and out.endswith("chars]") and "@" not in out
    assert scrub.text("x" * 1_000_000 + "@").endswith("chars]")


def test_structlog_processor_scrubs_the_event_dict():
    event = {"event": "paid by 4111 1111 1111 1111", "email": "a@b.example", "attempt": 2, "ok": True}
    assert scrub.processor(None, "info", event) == {
        "event": "paid by [card]",
        "email": "[email]",
        "attempt": 2,
        "ok": True,
    }


def test_stdlib_filter_scrubs_message_arguments_and_extras_in_place():
    record = logging.makeLogRecord(
        {"msg": "customer %s paid with %s", "args": ("ana.lopez@example.com", "4111 1111 1111 1111")}
    )
    record.customer = {"full_name": "Ana Lucia Lopez"}
    record.email = "ana.lopez@example.com"
    assert scrub.filter(record) is True
    assert (record.msg, record.args) == ("customer [email] paid with [card]", ())
    assert record.customer == {"full_name": "[name]"} and record.email == "[email]"
    bad = logging.makeLogRecord({"msg": "two %s %s", "args": ("ana.lopez@example.com",)})
    scrub.filter(bad)
    assert bad.getMessage() == "two %s %s [arguments dropped: they do not fit the format]"
