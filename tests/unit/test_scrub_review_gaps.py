"""Personal data that used to pass the scrubber: numbers given as ints, keys that are no strings,
unquoted names of several words, Indian mobiles without their trunk 0, JSON text inside a JSON string."""

from __future__ import annotations

import ast
import json
import logging
from typing import Any

import pytest

from jobsystem.observability.direct_lines import dumps
from jobsystem.observability.sentry import scrub_event
from jobsystem.privacy.scrub import Scrubber
from jobsystem.privacy.scrub_memo import ScrubMemo
from tests.pii_corpus import KEYED_IN_GROUPS, NATIONAL_IDS, leaks
from tests.pii_ordinary import ORDINARY

scrub = Scrubber()
hashing = Scrubber(hash_key="a-test-key-of-32-characters-long")

#: Numbers people store as integers (cards, long national ids written bare), each removed as a
#: string; shorter ones pass as ints (see ``SHORT_INT``).
PERSONAL_INTS = [4111111111111111, 5555555555554444, 378282246310005] + [
    int(value) for _, value in NATIONAL_IDS if value.isdigit() and value[0] != "0" and len(value) >= 13
]
#: Integers of a job system: counts, ids, epoch seconds and milliseconds, amounts in cents.
ORDINARY_INTS = [
    0,
    1,
    3,
    42,
    65535,
    999_999,
    1_000_000,
    1764432000,
    1715727134,  # epoch seconds that pass a national number's check as text
    262083544577,  # so does this 12-digit id
    1764432000123,
    73905561427,
    123456789,
    -42,
    -1764432000123,  # negative: a difference of epoch milliseconds
    -73905561427,
    -(10**15),  # 16 digits, but no card's
    -9_007_199_254_740_993,  # past the largest exact float
]


@pytest.mark.parametrize("number", PERSONAL_INTS)
def test_an_int_a_string_of_the_same_digits_would_lose_is_replaced_under_any_key(number):
    written = scrub.text(str(number))
    assert written != str(number) and written.startswith("[")  # the string rules catch it
    assert scrub({"value": number}) == {"value": written}
    assert scrub([number, (number,)]) == [written, (written,)]
    assert scrub.mapping({"event": "paid", "n": number}) == {"event": "paid", "n": written}
    assert ScrubMemo(scrub).mapping({"event": "paid", "n": number}) == {"event": "paid", "n": written}
    assert hashing({"n": number}) == {"n": hashing.text(str(number))}  # one person, one hash
    record = logging.makeLogRecord({"msg": "paid"})
    record.n = number
    scrub.filter(record)
    assert vars(record)["n"] == written


@pytest.mark.parametrize("number", PERSONAL_INTS)
def test_a_negative_int_is_judged_by_its_digits_as_the_positive_one(number):
    """A card number stored with a sign (an import that took a dash for one) is still the card:
    ints are judged by their digits, 13 or more of them (``SHORT_INT``)."""
    written = scrub.text(str(number))
    assert scrub({"value": -number}) == {"value": written}
    assert scrub.mapping({"event": "paid", "n": -number}) == {"event": "paid", "n": written}
    assert ScrubMemo(scrub).mapping({"event": "paid", "n": -number}) == {"event": "paid", "n": written}
    assert scrub({-number: "x"}) == {written: "x"}
    assert hashing({"n": -number}) == {"n": hashing.text(str(number))}  # one person, one hash


@pytest.mark.parametrize("number", ORDINARY_INTS)
def test_ordinary_ints_stay_ints(number):
    for out in (scrub({"n": number}), ScrubMemo(scrub).mapping({"n": number})):
        assert out == {"n": number} and type(out["n"]) is int
    assert scrub([number]) == [number]


def test_bools_and_floats_are_not_judged_as_digits():
    event = {"ok": True, "amount": 4111111111111111.0, "flag": False}
    assert scrub(event) == event and ScrubMemo(scrub).mapping(event) == event


def test_a_key_that_is_no_string_is_judged_as_a_value_and_rendered_as_json():
    event = {
        4111111111111111: "x",
        ("jose@example.com",): 1,
        frozenset({"ana.lopez@example.com"}): 2,
        7: "seven",
        None: 2.5,
    }
    out = scrub.mapping(event)
    assert out == {"[card]": "x", "('[email]',)": 1, "['[email]']": 2, 7: "seven", None: 2.5}
    rendered = dumps(out)
    assert leaks(rendered) == [] and "jose" not in rendered and json.loads(rendered)["[card]"] == "x"
    assert scrub(out) == out  # scrubbing its own output changes nothing: ``[card]`` names no key
    assert ScrubMemo(scrub).mapping(event) == out
    hashed = hashing({4111111111111111: "x"})
    assert hashed == {hashing.text("4111 1111 1111 1111"): "x"} and hashing(hashed) == hashed


#: Form-style keys (a web framework's ``params``): the bracketed part names the value.
FORM_KEYS = {
    "params[password]": ("hunter2-Secret", "[password]"),
    "user[first_name]": ("Ana", "[name]"),
    "customer[email]": ("ana.lopez@example.com", "[email]"),
    "data[api_key]": ("abc123xyz", "[secret]"),
    "form[iban]": ("GB82WEST12345698765432", "[iban]"),
    "items[0][email]": ("jose@example.com", "[email]"),
}


def test_a_bracketed_key_names_its_value_though_it_looks_like_a_replacement():
    event = {key: value for key, (value, _) in FORM_KEYS.items()}
    expected = {key: label for key, (_, label) in FORM_KEYS.items()}
    assert scrub.mapping(event) == expected  # structlog's processor
    assert ScrubMemo(scrub).mapping(event) == expected  # the job lines' memo
    assert scrub(expected) == expected
    sentry: Any = scrub_event(
        Scrubber(), {"extra": dict(event), "breadcrumbs": {"values": [{"data": event}]}}
    )
    assert sentry is not None and leaks(json.dumps(sentry)) == [] and "hunter2" not in json.dumps(sentry)
    assert sentry["extra"] == expected and sentry["breadcrumbs"]["values"][0]["data"] == expected
    hashed = hashing.mapping(event)
    assert hashed["params[password]"] == "[password]" and hashed["user[first_name]"].startswith("name:")
    record = logging.LogRecord("x", logging.INFO, "f", 1, "login %(params[password])s", (event,), None)
    assert scrub.filter(record) and record.msg == "login [password]"  # the logging filter
    # A key that is a replacement standing alone (a key we scrubbed) still names nothing.
    assert scrub.mapping({"[card]": 2, "('[email]',)": 3}) == {"[card]": 2, "('[email]',)": 3}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("name=José Pérez", "name=[name]"),
        ("name=José Pérez, status=ok", "name=[name], status=ok"),
        ("name=José status=ok", "name=[name] status=ok"),
        ("name=José Pérez status=ok", "name=[name] status=ok"),
        ("name=José Pérez Status=active", "name=[name] Status=active"),
        ("full_name: Ana Lucia Lopez paid", "full_name: [name] paid"),
        ("customer_name=María de la Cruz; tier=gold", "customer_name=[name]; tier=gold"),
        ("recipient=Jean-Luc O'Brien. Next", "recipient=[recipient]. Next"),
        ("name=J. R. Smith ok", "name=[name] ok"),
        ("name=José\nPérez Reports", "name=[name]\nPérez Reports"),  # the line ends the value
        ("name=ana status=ok", "name=[name] status=ok"),
        # A first word in lower case is a thing's name; after a person's, a heading (``Failed:``)
        # is taken with it, as a surname before a colon is (``Pérez:``).
        ("queue name=default Processing 3 messages", "queue name=[name] Processing 3 messages"),
        ("name=cleanup Failed: timeout", "name=[name] Failed: timeout"),
        ("recipient=ana@example.com Status: sent", "recipient=[recipient] Status: sent"),
        ("task name=report OK", "task name=[name] OK"),
        ("name=Ana Failed: timeout", "name=[name]: timeout"),
        ("name=María de la Cruz Status: sent", "name=[name]: sent"),
        ("name=José Pérez: failed", "name=[name]: failed"),
        # Five words or more: particles in any case do not count towards the bound of eight.
        ("name=Ana María de la Cruz", "name=[name]"),
        ("name=Ana María Fernanda López García", "name=[name]"),
        ("name=Maria De La Cruz Lopez status=ok", "name=[name] status=ok"),
        ("full_name=José María Álvarez del Manzano y López del Hierro, n=2", "full_name=[name], n=2"),
        ("customer_name=João Pedro Gonçalves Pereira da Silva Santos paid", "customer_name=[name] paid"),
        ("recipient=Mohammed bin Rashid Al Maktoum: sent", "recipient=[recipient]: sent"),
        ("name=Ana María Fernanda López García processed 3 of 5", "name=[name] processed 3 of 5"),
        ("name=Ana Lopez 2026-11-02T10:00:00Z v3.11.7 x=1", "name=[name] 2026-11-02T10:00:00Z v3.11.7 x=1"),
        ("name=Aa Bb Cc Dd Ee Ff Gg Hh Ii", "name=[name] Ii"),  # eight words at most
        ("name=Jan van den Berg status=ok", "name=[name] status=ok"),
        ("name=María de los Ángeles García status=ok", "name=[name] status=ok"),
        ("name=Mohamed el Amrani status=ok", "name=[name] status=ok"),
        ("recipient=Ana da Silva e Santos: sent", "recipient=[recipient]: sent"),
        ("name=Karl zu Guttenberg ok", "name=[name] ok"),
        # In a script without case: the words of the same script after the first.
        ("name=محمد علي status=ok", "name=[name] status=ok"),
        ("name=राहुल शर्मा status=ok", "name=[name] status=ok"),
        ("name=山田 太郎 status=ok", "name=[name] status=ok"),
        ("name=محمد علي Processing 3", "name=[name] Processing 3"),  # another script stops it
        ("name=محمد علي حالة=ok", "name=[name] حالة=ok"),  # a key stops it
    ],
)
def test_an_unquoted_name_of_several_words_is_replaced_whole(text, expected):
    assert scrub.text(text) == expected
    assert scrub.text(expected) == expected


@pytest.mark.parametrize("name", ["José Pérez", "محمد علي", "राहुल शर्मा"])
def test_an_unquoted_name_hashes_as_the_same_name_under_a_key(name):
    assert hashing.text(f"name={name} ok") == f"name={hashing({'name': name})['name']} ok"


@pytest.mark.parametrize(("key", "label", "value"), KEYED_IN_GROUPS)
def test_a_keyed_number_in_groups_is_replaced_whole_and_the_words_after_it_stay(key, label, value):
    for line, expected in (
        (f"{key}: {value}", f"{key}: [{label}]"),
        (f"{key}={value} retried 3 times", f"{key}=[{label}] retried 3 times"),
        (f"{key}: {value}, port 5672", f"{key}: [{label}], port 5672"),
        (f"{key}: {value} at 10:20:33 (v3.11.7)", f"{key}: [{label}] at 10:20:33 (v3.11.7)"),
        (f"{key}: {value}. Next: 3", f"{key}: [{label}]. Next: 3"),
        (f"{{{key}: {value}}}", f"{{{key}: [{label}]}}"),
    ):
        assert scrub.text(line) == expected
        assert leaks(scrub.text(line)) == []
    hashed = hashing({key: value})[key]
    assert hashing.text(f"{key}: {value} ok") == f"{key}: {hashed} ok"  # one person, one hash
    assert hashing.text(f"{key}: {hashed} 3 ok") == f"{key}: {hashed} 3 ok"  # its own output stays


#: Keyed numbers their checks confirm, each followed by ordinary text in the tests below.
CONFIRMED = [
    ("phone", "phone", "0161 496 0000"),
    ("mobile", "phone", "70123 45678"),
    ("phone", "phone", "+44 20 7946 0958"),
    ("iban", "iban", "DE89 3704 0044 0532 0130 00"),
    ("iban", "iban", "BE71 0961 2345 6769"),
    ("card", "card", "4111 1111 1111 1111"),
    next(entry for entry in KEYED_IN_GROUPS if entry[0] == "tax_id"),  # a German IdNr
]


@pytest.mark.parametrize("after", ORDINARY)
def test_ordinary_values_right_after_a_confirmed_keyed_number_stay(after):
    """Ports, zip codes, timestamps, ids and versions after the number are not groups of it: of
    the groups after a key, the longest run its checks confirm is taken."""
    for key, label, value in CONFIRMED:
        assert scrub.text(f"{key}: {value} {after}") == f"{key}: [{label}] {after}"


@pytest.mark.parametrize(
    "text",
    [
        "actor_name=send_email Retrying in 200 ms",  # no label: not a person's name
        "queue_name=emails Default",
        "template=Welcome Back Email",
    ],
)
def test_text_after_a_key_that_names_no_person_stays(text):
    assert scrub.text(text) == text


@pytest.mark.parametrize(
    ("written", "international"),
    [
        ("70123 45678", "+91 70123 45678"),
        ("91234 56789", "+91 91234 56789"),
        ("81234 56789", "+91 8123456789"),
    ],
)
def test_an_indian_mobile_written_without_its_trunk_zero_is_replaced(written, international):
    assert scrub.text(f"call {written} today") == "call [phone] today"
    for before in ("my number is", "sms", "Ana's", "phones", "whatsapp"):  # no list named before it
        assert scrub.text(f"{before} {written}") == f"{before} [phone]"
    assert scrub.text(f"call {international} today") == "call [phone] today"
    assert hashing.text(written) == hashing.text(international)  # one person, one hash


@pytest.mark.parametrize(
    "text",
    [
        "ports 15672 15673",  # starts as no Indian mobile does
        "ids 12345 67890",
        "order 7012345678 placed",  # a bare run of digits: an order number as often as a phone
        "EUR 98 765 432,10",
        "took 98765 ms of 43210",
        "counts 70001 70002 70003",  # a list of numbers, two of which would make a mobile
        "passive ports 60000-61000",  # a range: India writes its mobiles with a space
        "ids 70001-70500 reindexed",
        "offsets 98304 99328",  # after a plural: a list of two numbers
        "zip codes 90210 94105",
        "zip codes: 90210 94105",
    ],
)
def test_two_groups_of_five_digits_that_are_no_indian_mobile_stay(text):
    assert scrub.text(text) == text


#: Records whose values only their keys give away, written below as JSON text in JSON strings.
NESTED_RECORDS = [
    {"name": "José Pérez", "n": 1},
    {"full_name": 'José "Pepe" Pérez', "email": "ana.lopez@example.com"},
    {"customer": {"name": "Zoë Gómez"}, "note": "ok"},
    {"password": 'back\\slash "and" quotes', "tel": "0161 496 0000", "port": 5672},
]


def _dumped(value: object, times: int) -> str:
    for _ in range(times):
        value = json.dumps(value)
    assert isinstance(value, str)
    return value


def _loaded(text: str, times: int) -> object:
    value: object = text
    for _ in range(times):
        value = json.loads(value)  # type: ignore[arg-type]
    return value


@pytest.mark.parametrize("record", NESTED_RECORDS)
def test_json_text_inside_a_json_string_loses_the_whole_value(record):
    twice = json.dumps(json.dumps(record))
    out = scrub.text(twice)
    for word in ("Pérez", "P\\\\u00e9rez", "Pepe", "ana.lopez", "G\\\\u00f3mez", "Zo", "slash", "496"):
        assert word not in out, out
    assert json.loads(json.loads(out)) == scrub(record)  # the same as the record scrubbed
    assert scrub.text(out) == out


@pytest.mark.parametrize("record", NESTED_RECORDS)
def test_json_text_inside_a_json_string_inside_a_json_string_loses_the_whole_value(record):
    """Three ``json.dumps`` deep (a message body's JSON kept as a string in a JSON log line, itself
    a string in an exported event): each quote is written ``\\\\\\"``."""
    out = scrub.text(_dumped(record, 3))
    escaped = ("P\\\\\\\\u00e9rez", "G\\\\\\\\u00f3mez")
    for word in ("Pérez", *escaped, "Pepe", "ana.lopez", "Zo", "slash", "496"):
        assert word not in out, out
    assert _loaded(out, 3) == scrub(record)
    assert scrub.text(out) == out


@pytest.mark.parametrize("times", [4, 5, 7])
@pytest.mark.parametrize("record", NESTED_RECORDS)
def test_json_text_nested_deeper_loses_the_whole_value_up_to_seven_json_dumps(record, times):
    """Three ``json.dumps`` deep were read, a fourth was not: its quotes come after seven
    backslashes, and ``{"name": "José Pérez"}`` passed whole. Seven deep is read (a quote after
    63 backslashes; :data:`~jobsystem.privacy.scrub_text.JSON_DEPTH`), and the repr of six."""
    out = scrub.text(_dumped(record, times))
    assert _loaded(out, times) == scrub(record), out
    assert scrub.text(out) == out
    body = repr(_dumped(record, times - 1).encode())  # its backslashes doubled: 2, 6, 14, 30, 62
    assert _loaded(ast.literal_eval(scrub.text(body)).decode(), times - 1) == scrub(record)


@pytest.mark.parametrize(
    "value", ['{"a":{"b":{"c":{"email":"ana@example.com"}}}}', '{"a":{"b":{"c":{"name":"Ana"}}}}']
)
def test_json_objects_nested_in_each_other_are_read_at_any_depth(value):
    """Objects inside objects (JSON text as it is, not inside strings) have no escapes: the key
    before a value is read whatever the depth (``{"a":{"b":{"c":{"email":...}}}}``)."""
    assert "ana" not in scrub.text(value).lower()


@pytest.mark.parametrize("times", [2, 3, 4, 5, 7])
def test_json_text_nested_in_json_strings_hashes_as_the_value_alone(times):
    hashed = hashing({"name": "José Pérez"})["name"]
    assert hashing.text(_dumped({"name": "José Pérez"}, times)) == _dumped({"name": hashed}, times)


@pytest.mark.parametrize("times", [1, 2, 3, 4, 5, 7, 8])
def test_ordinary_json_text_nested_in_json_strings_stays(times):
    record = {"queue_name": "emails", "port": 5672, "at": "2026-11-02T19:13:00Z", "version": "3.11.7"}
    record |= {"zip": "90210", "order_id": "ord-20261102-0042", "note": 'a "quoted" \\ word'}
    assert scrub.text(_dumped(record, times)) == _dumped(record, times)


@pytest.mark.parametrize("times", [2, 3, 4, 5, 7])
@pytest.mark.parametrize("address", ["zoë@exämple.com", "maría.garcía@example.es", "jose\u0301@example.com"])
def test_an_address_with_non_ascii_letters_in_nested_json_text_is_replaced_whole(times, address):
    """Nested in JSON strings, ``ë`` is written ``\\\\u00eb`` (its backslash escaped too): the
    address passed whole, or all but its last letters (``mar\\\\u00eda.garc\\\\[email]``)."""
    record = {"note": f"write to {address}\u2014thanks, Zoë"}
    out = scrub.text(_dumped(record, times))
    assert _loaded(out, times) == {"note": "write to [email]\u2014thanks, Zoë"}, out
    assert hashing.text(_dumped(record, times)).count(hashing.text(address)) == 1  # one person, one hash
