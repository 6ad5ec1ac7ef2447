"""Free-form values after a key in free text: an unquoted address, date of birth, postcode or
configured key's value was cut at its first space (``address=221B Baker Street`` kept ``Baker
Street``); it runs on to the end of its value, or, for a date of birth or a postcode in a shape,
to the end of that shape."""

from __future__ import annotations

import pytest

from jobsystem.privacy.scrub import Scrubber
from jobsystem.privacy.scrub_freeform import freeform_end
from tests.pii_corpus import KEYED_FREE_FORM, KEYED_SHAPED, leaks
from tests.pii_ordinary import ORDINARY

scrub = Scrubber()
hashing = Scrubber(hash_key="a-test-key-of-32-characters-long")


def _lines(key: str, value: str, label: str) -> list[tuple[str, str]]:
    """(line, expected) with the value where a log line holds one, ended by the next pair, a
    bracket or a quote opened before the key, or the line's end."""
    gone = f"[{label}]"
    return [
        (f"{key}={value}", f"{key}={gone}"),
        (f"{key}: {value} status=failed", f"{key}: {gone} status=failed"),
        (f"{key}={value}, status=failed retried 3 times", f"{key}={gone}, status=failed retried 3 times"),
        (f"{key}: {value}; 'tier': 'gold'", f"{key}: {gone}; 'tier': 'gold'"),
        (f"({key}: {value}) retried", f"({key}: {gone}) retried"),
        (f"{{{key}: {value}, tier: gold}}", f"{{{key}: {gone}, tier: gold}}"),
        (f"Customer({key}={value}, tier='gold')", f"Customer({key}={gone}, tier='gold')"),
        (f'{{"note": "{key}: {value}", "n": 1}}', f'{{"note": "{key}: {gone}", "n": 1}}'),
        (f"note='{key}: {value}' sent", f"note='{key}: {gone}' sent"),
        (f"{key}: {value}\nretried 3 times", f"{key}: {gone}\nretried 3 times"),
        (f"/orders?{key}={value.replace(' ', '+')}&n=2", f"/orders?{key}={gone}&n=2"),
    ]


@pytest.mark.parametrize(("key", "label", "value"), KEYED_FREE_FORM)
def test_an_unquoted_free_form_value_is_replaced_up_to_the_next_pair_bracket_quote_or_line_end(
    key, label, value
):
    for line, expected in _lines(key, value, label):
        out = scrub.text(line)
        assert out == expected and leaks(out) == [] and scrub.text(out) == out, line


@pytest.mark.parametrize(("key", "label", "value"), KEYED_FREE_FORM + KEYED_SHAPED)
def test_an_unquoted_keyed_value_of_several_words_hashes_as_the_value_under_the_key(key, label, value):
    hashed = hashing({key: value})[key]
    assert hashing.text(f"{key}={value} status=ok") == f"{key}={hashed} status=ok"  # one person, one hash
    assert hashing.text(f"{key}={hashed} status=ok") == f"{key}={hashed} status=ok"  # its own output stays


@pytest.mark.parametrize(("key", "label", "value"), KEYED_SHAPED)
def test_a_date_of_birth_or_postcode_is_taken_by_its_shape_and_the_words_after_it_stay(key, label, value):
    lines = _lines(key, value, label)
    for after in (" retried 3 times", ", sent to Paris", ". Next: 3", " at 10:20:33 (v3.11.7)"):
        lines.append((f"{key}: {value}{after}", f"{key}: [{label}]{after}"))
    for line, expected in lines:
        out = scrub.text(line)
        assert out == expected and leaks(out) == [], line


#: Dates and postcodes of one word: their first word always was the value (guards, not faults).
ONE_WORD = [
    ("dob", "birth_date", "1980-03-12"),
    ("date_of_birth", "birth_date", "12/03/1980"),
    ("birthdate", "birth_date", "1980-03-12T00:00:00Z"),
    ("postal_code", "address", "75002"),
    ("zip_code", "address", "94105-1234"),
    ("postcode", "address", "1000-001"),
]


@pytest.mark.parametrize("after", ORDINARY)
def test_ordinary_values_right_after_a_shaped_date_of_birth_or_postcode_stay(after):
    for key, label, value in KEYED_SHAPED + ONE_WORD:
        assert scrub.text(f"{key}: {value} {after}") == f"{key}: [{label}] {after}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # A date of birth or a postcode in no shape known is free-form: removed up to its end.
        ("dob: unknown, see file status=ok", "dob: [birth_date] status=ok"),
        ("date_of_birth=12 Marchh 1980 status=ok", "date_of_birth=[birth_date] status=ok"),
        ("postcode: see the notes (rear door) status=ok", "postcode: [address] status=ok"),
        # A quote that opens inside the value closes inside it; an apostrophe is part of a word.
        ('address: 5 "Les Lilas" rue d\'Alsace, status=ok', "address: [address], status=ok"),
        ("note='address: 5 rue d'Alsace' sent", "note='address: [address]' sent"),
        ("address: Flat 3 (rear), 5 rue de la Paix status=ok", "address: [address] status=ok"),
        # A bracket that closes nothing opened before the key ends nothing.
        ("address: 5 rue de la Paix) Paris", "address: [address]"),
        # JSON text inside a JSON string: the escaped quote that opened before the key ends it.
        (
            '"{\\"note\\": \\"address: 5 rue\\", \\"n\\": 1}"',
            '"{\\"note\\": \\"address: [address]\\", \\"n\\": 1}"',
        ),
    ],
)
def test_where_a_free_form_value_ends_when_in_doubt(text, expected):
    assert scrub.text(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "remote_address=81.2.69.142:5672 closed by peer",
        "bind_address=0.0.0.0:9191 listening",
        "mac_address=00:1a:2b:3c:4d:5e seen",
        "reply_address=ana@example.com bounced",
        "server_address=amqp://rabbit:5672/%2F connected",
        "remote_address=[2001:db8::1]:5672 closed by peer",  # IPv6 in brackets, with a port
    ],
)
def test_a_machines_address_under_an_address_key_is_one_word_and_the_words_after_it_stay(text):
    key, rest = text.split("=", 1)
    assert scrub.text(text) == f"{key}=[address] {rest.split(' ', 1)[1]}"


def test_a_configured_keys_unquoted_value_runs_to_the_end_of_its_value():
    custom = Scrubber(extra_keys=["delivery_note", "loyalty_id"])
    line = "delivery_note=leave it with Ana at number 42 status=ok"
    assert custom.text(line) == "delivery_note=[redacted] status=ok"
    assert custom.text("loyalty_id: L-123 (gold tier), n=2") == "loyalty_id: [redacted], n=2"
    assert scrub.text(line) == line  # not a key without the setting


def test_brackets_and_quotes_open_before_a_value_are_found_alike_afresh_or_going_on_from_the_last_look():
    """Each look for what is open before a value goes on from the last one on the same text (a
    line is read once); looked at afresh, in another order, each value ends at the same place."""
    line = '(address: 5 rue) "note": "address: 6 rue d\'Alsace", {address: 7 rue} (a\nb address: 8 rue) y'
    expected = (
        '(address: [address]) "note": "address: [address]", {address: [address]} (a\nb address: [address]'
    )
    assert scrub.text(line) == expected
    values = ["5 rue", "6 rue d'Alsace", "7 rue", "8 rue) y"]
    starts = [line.index(value) for value in values]
    in_order = [freeform_end(line, begin, begin + 1) for begin in starts]
    copy = (line + ".")[:-1]  # another object: nothing remembered of it
    afresh = [freeform_end(copy, begin, begin + 1) for begin in reversed(starts)][::-1]
    assert in_order == afresh == [begin + len(value) for begin, value in zip(starts, values, strict=True)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("address={'line1': '221B Baker Street', 'city': 'London'}", "address=[address]"),
        ("address=['221B Baker Street', 'London'] status=ok", "address=[address] status=ok"),
        ("address=('221B Baker Street', 'London'), n=2", "address=[address], n=2"),
        ("Order(address=<Address: 221B Baker Street>, n=2)", "Order(address=[address], n=2)"),
        ("full_name=('Ana', 'Lopez') paid", "full_name=[name] paid"),
        # Quoted as its key is: JSON text stays JSON, a repr stays a literal.
        (
            '{"address": {"line1": "221B Baker Street", "city": "London"}, "n": 1}',
            '{"address": "[address]", "n": 1}',
        ),
        ("{'shipping_address': ['221B Baker Street', 'London']}", "{'shipping_address': '[address]'}"),
        # Brackets of another kind, a bracket in quotes, an escaped quote: inside the value.
        ("address=(Flat 3 -> rear, 5 rue d'Alsace) status=ok", "address=[address] status=ok"),
        ("address={'line1': 'O\\'Brien St (rear)', 'city': 'Cork'} ok", "address=[address] ok"),
        # No bracket closes it (a line cut short): the value runs to the line's end.
        ("address={'line1': '221B Baker Street', [cut]\nretried", "address=[address]\nretried"),
    ],
)
def test_a_value_in_brackets_after_a_personal_key_is_replaced_whole(text, expected):
    """A value in brackets matched no value at all: ``address={'line1': '221B Baker Street'}``
    passed whole, and the pairs inside it (``'line1':``) name nothing."""
    out = scrub.text(text)
    assert out == expected and leaks(out) == [] and scrub.text(out) == out
    hashed = hashing.text(text)
    assert "Baker" not in hashed and "Lopez" not in hashed and hashing.text(hashed) == hashed


def test_a_value_in_brackets_in_json_text_inside_a_json_string_stays_json():
    import json

    record = {"address": {"line1": "221B Baker Street", "city": "London"}, "n": 1}
    out = scrub.text(json.dumps(json.dumps(record)))
    assert json.loads(json.loads(out)) == scrub(record) == {"address": "[address]", "n": 1}


@pytest.mark.parametrize(
    "text",
    [
        "address=[] status=ok",  # empty: nothing to remove
        "address={} n=2",
        "address=[address] status=ok",  # already removed
        "password=[Filtered]",
        "actor 'send_email': ['welcome', 'reset'] queued",  # no email address's shape
        "phone: (none) given",
    ],
)
def test_a_value_in_brackets_that_is_empty_removed_or_of_no_shape_stays(text):
    assert scrub.text(text) == text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ip_address=[2001:db8::1]:443", "ip_address=[ip]"),
        ("client_ip=[2a00:1450:4001:82b::200e]:443 closed", "client_ip=[ip] closed"),
        ("remote_addr: [2001:db8::1] refused", "remote_addr: [ip] refused"),
    ],
)
def test_an_ipv6_address_in_brackets_with_a_port_after_an_ip_key_is_replaced(text, expected):
    """A documentation or private address is no person's by its shape, but under a key naming a
    client's address it is removed as any value is; in brackets it matched no value."""
    assert scrub.text(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("address=ana@example.com, 221B Baker Street", "address=[address]"),
        ("address: ana@example.com; 5 rue de la Paix, 75002 Paris status=ok", "address: [address] status=ok"),
        ("home_address=81.2.69.142, Flat 3, 12 Rue Lepic", "home_address=[address]"),
        # Under a key naming a machine's address, its address stays one word.
        ("remote_address=81.2.69.142:5672, retrying in 5 s", "remote_address=[address], retrying in 5 s"),
    ],
)
def test_a_mailbox_followed_by_more_parts_under_an_address_key_is_taken_whole(text, expected):
    """A mailbox's address as the first word of an address was all of it: the street after its
    ``,`` stayed (``address=[address], 221B Baker Street``)."""
    assert scrub.text(text) == expected
