"""The scrubber on its own: the whole corpus is removed, ordinary values of a job system pass."""

from __future__ import annotations

import logging
import random
import re
import sys
from typing import Any

import pytest

from jobsystem.privacy.scrub import Scrubber, exception_text
from jobsystem.privacy.scrub_pairs import SHAPED_LABELS
from tests.pii_corpus import (
    BY_KEY,
    BY_PATTERN,
    ENCODED_EMAILS,
    NATIONAL_IDS,
    NEW_KEYS,
    ORDINARY,
    SECRETS,
    SHAPES,
    free_text,
    keyed,
    leaks,
)

scrub = Scrubber()
hashing = Scrubber(hash_key="a-test-key-of-32-characters-long")


@pytest.mark.parametrize(("label", "value"), BY_PATTERN)
def test_value_found_by_pattern_is_replaced_wherever_it_sits(label, value):
    assert scrub.text(f"contact {value}, thanks") == f"contact [{label}], thanks"
    assert scrub.text(value) == f"[{label}]"
    assert scrub.text(f"({value})") == f"([{label}])"


@pytest.mark.parametrize(("label", "value"), NATIONAL_IDS + SHAPES)
def test_national_ids_and_new_shapes_are_replaced_wherever_they_sit(label, value):
    assert scrub.text(f"contact {value}, thanks") == f"contact [{label}], thanks"
    assert scrub.text(value) == f"[{label}]"
    assert scrub.text(f"[{value}]") == f"[[{label}]]"
    assert scrub.text(f"x={value}") == f"x=[{label}]"
    assert leaks(scrub.text(f"{value.upper()} {value.lower()}")) == []


@pytest.mark.parametrize(("url", "encoded", "address"), ENCODED_EMAILS)
def test_url_encoded_email_addresses_are_replaced(url, encoded, address):
    assert scrub.text(url) == url.replace(encoded, "[email]")
    assert hashing.text(url) == url.replace(encoded, hashing.text(address))  # one person, one hash


def test_a_random_order_number_stays_and_so_do_most_numbers_of_any_length():
    assert scrub.text("order 73905561427 placed") == "order 73905561427 placed"
    # Only numbers a check confirms are removed; a single check digit passes about one random
    # number in eleven, and a few lengths carry several national numbers (9: BSN and TFN).
    ceilings = {7: 0.01, 8: 0.01, 9: 0.22, 10: 0.14, 11: 0.08, 12: 0.12, 13: 0.04, 16: 0.04}
    rng = random.Random(42)
    for length, ceiling in ceilings.items():
        numbers = [str(rng.randrange(10 ** (length - 1), 10**length)) for _ in range(1000)]
        removed = sum(scrub.text(f"ref {n} ok") != f"ref {n} ok" for n in numbers) / len(numbers)
        assert removed <= ceiling, (length, removed)


def test_phones_hash_the_same_in_international_and_national_form():
    assert hashing.text("+44 20 7946 0321") == hashing.text("020 7946 0321") == hashing.text("+442079460321")


@pytest.mark.parametrize(("key", "label", "value"), NEW_KEYS)
def test_key_names_in_any_case_or_separator_variant(key, label, value):
    for variant in (
        key,
        key.upper(),
        key.lower(),
        f"customer_{key}",
        f"customer-{key}",
        f"Customer{key.title()}",
    ):
        assert scrub({variant: value}) == {variant: f"[{label}]"}, variant
    assert scrub.text(f"{key}={value!r} and more") == f"{key}='[{label}]' and more"
    # Unquoted, a label with a shape of its own (an address, a number) also needs that shape.
    line = f"{key}: {value.split()[0]} and more"
    expected = line if label in SHAPED_LABELS else f"{key}: [{label}] and more"
    assert scrub.text(line) == expected


@pytest.mark.parametrize(
    "key", ["mail_server", "ip_whitelist", "pass_rate", "contact_id", "recipient_count", "tel_prefix"]
)
def test_short_key_names_as_a_qualifier_keep_their_values(key):
    assert scrub({key: "smtp.example.com:25"}) == {key: "smtp.example.com:25"}


def test_a_key_whose_label_has_a_shape_needs_that_shape_in_free_text():
    line = "actor 'send_email': rate_limit service 'smtp' is not configured in RATE_LIMITS"
    assert scrub.text(line) == line
    assert scrub.text("'send_email': 'ana@example.com'") == "'send_email': '[email]'"


def test_credentials_without_a_scheme_as_urlsplit_leaves_them():
    from urllib.parse import urlsplit

    url = urlsplit("smtps://mailer:Pa55-w0rd!x@smtp.example.com:465")
    assert "Pa55-w0rd!x" not in scrub.text(repr(url)) and "Pa55-w0rd!x" not in scrub.text(str(list(url)))
    assert scrub.text(url.netloc) == "mailer:[password]@smtp.example.com:465"
    assert scrub.text("amqp://jobs:p@ss:w0rd@rabbit:5672/%2F") == "amqp://jobs:[password]@rabbit:5672/%2F"


def test_configured_secrets_are_removed_wherever_they_appear():
    custom = Scrubber(secrets=["Zq8-long-broker-secret", "short"])
    assert custom.text("auth failed for Zq8-long-broker-secret!") == "auth failed for [secret]!"
    assert custom.text("a short word") == "a short word"  # under six characters: not looked for


def test_exception_text_covers_cause_context_group_members_and_args():
    def chain() -> BaseException:
        try:
            try:
                raise KeyError("ana.lopez@example.com")
            except KeyError as exc:
                raise ValueError("lookup failed", "+4915112345678") from exc
        except ValueError as exc:
            try:
                raise RuntimeError("while reporting, card 4111.1111.1111.1111")
            except RuntimeError as inner:
                return ExceptionGroup("batch", [exc, inner, TypeError(NATIONAL_IDS[2][1])])

    group = chain()
    text = exception_text(group)
    assert "ana.lopez@example.com" in text and "4915112345678" in text and NATIONAL_IDS[2][1] in text
    assert leaks(scrub(group)) == [] and leaks(repr(scrub({"error": group, "args": group.args}))) == []
    assert "caused by KeyError" in scrub(group) and "member TypeError: [id_number]" in scrub(group)


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
    node: list[Any] = deep
    for _ in range(sys.getrecursionlimit() + 10):
        node.append([])
        node = node[0]
    assert "[too deep]" in repr(scrub(deep))
    assert scrub({1: "ana.lopez@example.com", None: 2.5, ("t",): {3}}) == {
        1: "[email]",
        None: 2.5,
        "('t',)": [3],  # a tuple key as text: a JSON object's keys are (see test_scrub_review_gaps)
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
    extras = vars(record)  # set as attributes (``extra=``), read back from the record's dict
    assert extras["customer"] == {"full_name": "[name]"} and extras["email"] == "[email]"
    bad = logging.makeLogRecord({"msg": "two %s %s", "args": ("ana.lopez@example.com",)})
    scrub.filter(bad)
    assert bad.getMessage() == "two %s %s [arguments dropped: they do not fit the format]"


def test_the_cli_stream_keeps_each_line_apart_when_a_long_one_is_cut():
    """`jobctl dlq export` to the terminal writes one JSON record a line through the scrubbed
    stdout: a record past the scrubber's limit is cut, and its newline must stay."""
    import io

    from jobctl.output import ScrubbedStream

    out = io.StringIO()
    stream = ScrubbedStream(out, Scrubber(max_length=1_000).text)
    stream.write('{"note": "' + "x" * 2_000 + '"}\n{"email": "ana.lopez@example.com"}\n')
    first, second, last = out.getvalue().split("\n")
    assert first.endswith("chars]") and second == '{"email": "[email]"}' and last == ""


def test_a_dead_letters_keyword_arguments_are_shown_scrubbed_as_a_structure():
    """`jobctl dlq show` prints the body indented: a value under ``address`` spans lines the
    line-by-line scrub of the output cannot tie to its key."""
    import json as json_module

    from dramatiq import Message

    from jobctl.dlq import _shown

    body = Message(
        queue_name="q",
        actor_name="ship",
        args=(1042,),
        kwargs={"address": {"line1": "12 Rue Lepic", "city": "Paris"}, "name": {"last": "Lopez"}},
        options={},
    ).encode()
    shown = _shown(body)
    assert "Rue Lepic" not in shown and "Lopez" not in shown
    assert json_module.loads(shown)["kwargs"] == {"address": "[address]", "name": "[name]"}


def test_the_traceback_sent_to_an_on_retry_exhausted_hook_is_scrubbed():
    """Retries sends the failed message's dict to the hook actor: its stored traceback (the
    exception's message) would reach RabbitMQ in the hook's body."""
    import dramatiq
    from dramatiq.middleware import Retries

    from middleware.stored_tracebacks import ScrubStoredTracebacks
    from tests.unit.stub import RecordingBroker, delivery

    broker = RecordingBroker(middleware=[Retries(max_retries=0), ScrubStoredTracebacks(Scrubber().text)])
    dramatiq.actor(broker=broker, actor_name="hook", queue_name="q")(lambda message, retries: None)
    charge = dramatiq.actor(broker=broker, actor_name="charge", queue_name="q", on_retry_exhausted="hook")(
        lambda: None
    )
    failed = delivery(charge.message())
    try:
        raise ValueError("card 4111 1111 1111 1111 declined for ana.lopez@example.com")
    except ValueError as exc:
        broker.middleware[0].after_process_message(broker, failed, exception=exc)
    ((hook, _),) = broker.enqueued
    stored = hook.args[0]["options"]["traceback"]
    assert "ValueError" in stored and "4111" not in stored and "ana.lopez" not in stored


@pytest.mark.parametrize(
    ("written", "address"),
    [
        # json.dumps (ensure_ascii): what a CLI's --json output or a JSON payload in a message holds
        (r"zo\u00eb.garc\u00eda@ex\u00e4mple.com", "zoë.garcía@exämple.com"),
        (r"ana@ex\u00e4mple.com", "ana@exämple.com"),  # an internationalised domain alone
        # the repr of bytes: smtplib's replies in an exception's text
        (r"zo\xc3\xab.garc\xc3\xada@ex\xc3\xa4mple.com", "zoë.garcía@exämple.com"),
    ],
)
def test_email_addresses_with_escaped_non_ascii_letters_are_replaced_whole(written, address):
    assert scrub.text(f"<{written}>: mailbox busy") == "<[email]>: mailbox busy"
    assert hashing.text(written) == hashing.text(address)  # one person, one hash: escaped or not


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("write to ", r"\u2014thanks"),  # json.dumps of an em dash after the address
        ("", r"\u2019s inbox is full"),  # a right single quote: the address's owner
        (r"\u00ab", r"\u00bb ok"),  # French quotes around it
        ("reply: ", r"\u3002ok"),  # a CJK full stop
        ("b'to ", r"\xe2\x80\x94thanks'"),  # the repr of bytes: an em dash in UTF-8
    ],
)
def test_an_escaped_character_next_to_an_address_that_is_no_letter_stays_text(before, after):
    """Escapes stand for letters of an address, but also for the punctuation around one: that and
    the word after it are the text's, and the address hashes as it does everywhere else."""
    assert scrub.text(f"{before}ana@example.com{after}") == f"{before}[email]{after}"
    hashed = hashing.text("ana@example.com")
    assert hashing.text(f"{before}ana@example.com{after}") == f"{before}{hashed}{after}"


@pytest.mark.parametrize(
    "written",
    [
        r"jose\u0301@example.com",
        r"ana@ex\u0301ample.com",
        r"ana@exa\u00admple.com",
        r"jos\xc3\xa9@example.com",
    ],
)
def test_an_escaped_mark_or_invisible_character_inside_an_address_is_part_of_it(written):
    """A decomposed letter (``e`` and a combining accent) or a soft hyphen is no letter by
    ``isalnum``, but no separator either: the address is replaced whole, as before."""
    assert scrub.text(f"to {written} ok") == "to [email] ok"


def test_jobctl_json_output_loses_an_address_json_escaped():
    """`jobctl status --json` prints ``json.dumps`` of the record (non-ASCII as ``\\uXXXX``) through
    the scrubbed stdout: an address with a non-ASCII domain must not pass as plain words."""
    import io
    import json as json_module

    from jobctl.output import ScrubbedStream

    out = io.StringIO()
    stream = ScrubbedStream(out, Scrubber().text)
    stream.write(json_module.dumps({"state": "succeeded", "result": ["zoë@exämple.com"]}) + "\n")
    assert out.getvalue() == '{"state": "succeeded", "result": ["[email]"]}\n'


def test_jobctl_status_shows_a_jobs_result_scrubbed_as_a_structure(monkeypatch):
    """`jobctl status` prints the result the actor returned, kept unscrubbed in the store, as JSON
    through the scrubbed stdout: a dict or list under ``address`` is then text that no key is next
    to, line by line, as `jobctl dlq show` found for a body's keyword arguments."""
    from types import SimpleNamespace

    from click.testing import CliRunner

    import jobctl.main as cli
    from jobctl.output import protect_output
    from jobsystem.ops import status as ops_status
    from jobsystem.store.status_records import JobStatus

    scrubber = Scrubber()

    def load_system():
        protect_output(scrubber.text)  # as jobctl.project.load_system does
        return SimpleNamespace(store=None, broker=None, scrubber=scrubber)

    result = {"address": {"line1": "12 Rue Lepic", "city": "Paris"}, "full_name": ["Zoë", "Gómez"], "n": 2}
    record = JobStatus(message_id="m-1", state="succeeded", actor="ship", result=result)
    monkeypatch.setattr(cli, "load_system", load_system)
    monkeypatch.setattr(ops_status, "get_status", lambda message_id, state: record)
    for options in ([], ["--json"]):
        shown = CliRunner().invoke(cli.main, ["status", "m-1", *options])
        assert shown.exit_code == 0, shown.output
        assert '"address": "[address]"' in shown.output and '"n": 2' in shown.output
        for value in ("Rue Lepic", "Paris", "Zo", "G\\u00f3mez", "Gómez"):
            assert value not in shown.output, shown.output


def test_a_standard_library_records_arguments_are_scrubbed_as_structures(logging_restored):
    """A record formats its arguments into text before the scrubber sees it: a dict or list under
    ``address`` or ``name`` would then sit in brackets that no key is next to."""
    import io
    import json as json_module

    from jobsystem.observability.logs import configure_logging
    from jobsystem.settings import load_settings

    stream = io.StringIO()
    logging.getLogger().handlers = [logging.StreamHandler(stream)]
    configure_logging(load_settings({"LOG_FORMAT": "json", "LOG_LEVEL": "INFO"}))
    order = {"address": {"line1": "12 Rue Lepic", "city": "Paris"}, "full_name": ["Zoë", "Gómez"], "id": 7}
    app = logging.getLogger("shop.orders")
    app.warning("order %s held", order)
    app.warning("order %(id)s for %(full_name)s held", order)
    app.warning("%d orders held, first %r", 3, [order])
    lines = [json_module.loads(line)["event"] for line in stream.getvalue().splitlines()]
    assert lines[0] == "order {'address': '[address]', 'full_name': '[name]', 'id': 7} held"
    assert lines[1] == "order 7 for [name] held"
    assert lines[2].startswith("3 orders held, first [{'address': '[address]'")
    for value in ("Rue Lepic", "Paris", "Zo", "Gómez"):
        assert value not in stream.getvalue()


def test_a_standard_library_records_other_arguments_are_formatted_as_before():
    """Scrubbing a record's containers as structures must not change how the rest is formatted:
    ``%(path)s`` is ``str(path)``, not its repr, and a set is still shown as a set."""
    from pathlib import PurePosixPath

    def formatted(message: str, *args: object) -> str:
        record = logging.LogRecord("shop", logging.WARNING, __file__, 1, message, args, None)
        scrub.filter(record)
        return record.getMessage()

    arguments = {"path": PurePosixPath("/srv/reports/x.csv"), "error": RuntimeError("disk full"), "n": 2}
    assert formatted("wrote %(path)s after %(error)s (%(n)d)", arguments) == (
        "wrote /srv/reports/x.csv after disk full (2)"
    )
    assert formatted("queues %s, %d held", {"emails"}, 2) == "queues {'emails'}, 2 held"
    assert formatted("held for %(full_name)s", {"full_name": ["Zoë", "Gómez"]}) == "held for [name]"


def test_a_named_tuple_is_judged_by_its_field_names_in_a_log_line(logging_restored):
    """A named tuple logged as a field, or formatted into a standard-library record, has field names
    that name personal data: scrubbed item by item as a plain tuple, its values lost their keys."""
    import io
    import json as json_module
    from typing import NamedTuple

    import structlog

    from jobsystem.observability.logs import configure_logging
    from jobsystem.settings import load_settings

    class Customer(NamedTuple):
        full_name: str
        street: str
        orders: int

    stream = io.StringIO()
    logging.getLogger().handlers = [logging.StreamHandler(stream)]
    configure_logging(load_settings({"LOG_FORMAT": "json", "LOG_LEVEL": "INFO"}))
    customer = Customer("Zoë Gómez", "Calle Mayor 5", 3)
    structlog.get_logger("shop").info("order_held", customer=customer)
    logging.getLogger("shop.orders").warning("held for %s", [customer])
    logged = stream.getvalue()
    for value in ("Zo", "Gómez", "Calle Mayor"):
        assert value not in logged, logged
    first, second = (json_module.loads(line) for line in logged.splitlines())
    assert first["customer"] == ["[name]", "[address]", 3]  # a JSON array, as any tuple
    assert second["event"] == "held for [('[name]', '[address]', 3)]"


def test_jobctl_dlq_show_hides_the_positional_arguments_of_a_workflows_next_steps():
    """`jobctl dlq show` counts a body's positional arguments instead of showing them; the later
    steps of a workflow or pipeline travel in its options, arguments and all."""
    from jobctl.dlq import _shown
    from tests.unit.test_sentry_scrub import _workflow_messages

    for message in _workflow_messages():
        shown = "\n".join(map(scrub.text, _shown(message.encode()).split("\n")))  # as stdout scrubs it
        assert "send_report" in shown and "<1 positional, hidden>" in shown
        assert "Ana Lucia Lopez" not in shown, shown


@pytest.mark.parametrize(
    ("written", "international"),
    [
        ("(11) 98765-4321", "+55 11 98765-4321"),  # Brazil: area code in parentheses, no trunk 0
        ("(11) 3456-7890", "+55 11 3456-7890"),
        ("21 99876-5432", "+55 21 99876-5432"),
        ("138 0013 8000", "+86 138 0013 8000"),  # a Chinese mobile: never written with the 0
    ],
)
def test_a_national_number_its_region_writes_without_the_trunk_zero_is_replaced(written, international):
    """Brazil and China (regions covered) have a trunk 0, but write these numbers without it; the
    UK or Germany never do, so ``20 7946 0958`` stays a number there (tested above)."""
    assert scrub.text(f"ligar para {written} hoje") == "ligar para [phone] hoje"
    assert hashing.text(written) == hashing.text(international)  # one person, one hash


@pytest.mark.parametrize(
    "written",
    ["183 778 3533", "4 579 102 298", "129 9456 4982", "42 957 693 704", "950 136 3476", "1 404 611 086"],
)
def test_a_number_grouped_otherwise_than_its_region_writes_it_stays(written):
    """Read without the trunk 0, these are valid Brazilian, Chinese or Indian numbers, but each
    region writes them in other groups (``(45) 7910-2298``): written so, they are amounts and
    references, which were kept before numbers without the 0 were read at all."""
    assert scrub.text(f"total {written} ok") == f"total {written} ok"


def _finnish_id(birth: str, sign: str) -> str:
    """A valid Finnish personal identity code (henkilötunnus) of ``birth`` (ddmmyy) and century sign."""
    from stdnum.fi import hetu

    for serial in range(2, 900):
        for check in "0123456789ABCDEFHJKLMNPRSTUVWXY":
            code = f"{birth}{sign}{serial:03d}{check}"
            if hetu.is_valid(code):
                return code
    raise AssertionError("no valid code")


@pytest.mark.parametrize("sign", ["-", "+", "A"])  # born in the 1900s, the 1800s, the 2000s
def test_a_finnish_identity_code_is_replaced_whatever_its_century_sign(sign):
    """The sign between birth date and serial is part of the code: ``131052-308T`` is someone born
    in 1952, the most common case, and without its ``-`` it is no valid code at all."""
    code = _finnish_id("131052", sign)
    assert scrub.text(f"henkilötunnus {code} tarkistettu") == "henkilötunnus [id_number] tarkistettu"


def _nfd(text: str) -> str:
    import unicodedata

    return unicodedata.normalize("NFD", text)


@pytest.mark.parametrize(
    "address", ["josé@example.com", "ana@exámple.com", "josé.garcía@correo.es", "zoë@exämple.com"]
)
def test_an_address_written_decomposed_is_replaced_whole_and_hashed_as_composed(address):
    """NFD (macOS file names, some form inputs) writes ``é`` as ``e`` and U+0301, a mark that
    neither ``isalnum`` nor ``\\w`` takes for a letter: judged as NFC, the address is one."""
    decomposed = _nfd(address)
    assert decomposed != address
    assert scrub.text(f"write to {decomposed} now") == "write to [email] now"
    expected = hashing.text(address)
    assert hashing.text(f"write to {decomposed} now") == f"write to {expected} now"
    assert hashing({"email": decomposed}) == {"email": expected}  # under a key: one person, one hash


@pytest.mark.parametrize("address", ["josé@example.com", "ana@exámple.com"])
def test_an_address_json_escaped_decomposed_hashes_as_composed(address):
    """``json.dumps`` writes the decomposed ``é`` as ``e\\u0301``, the composed one as ``\\u00e9``."""
    import json

    escaped = json.dumps(_nfd(address))
    assert "\\u0301" in escaped
    assert scrub.text(escaped) == '"[email]"'
    assert hashing.text(escaped) == f'"{hashing.text(address)}"'
    assert hashing.text(json.dumps(address)) == f'"{hashing.text(address)}"'


@pytest.mark.parametrize(
    ("key", "name"), [("full_name", "José Pérez"), ("customer_name", "Renée Müller"), ("name", "Zoë")]
)
def test_a_keyed_name_written_decomposed_hashes_as_composed(key, name):
    import json

    expected = hashing({key: name})[key]
    assert expected.startswith("name:")
    assert hashing({key: _nfd(name)}) == {key: expected}
    assert hashing.text(json.dumps({key: _nfd(name)})) == json.dumps({key: expected})
    assert hashing.text(json.dumps({key: name})) == json.dumps({key: expected})  # escaped or not
    first = name.split()[0]
    assert hashing.text(f"{key}={_nfd(first)} ok") == f"{key}={hashing({key: first})[key]} ok"


@pytest.mark.parametrize(
    "address",
    [
        "अनिल@example.com",  # Devanagari: vowel signs are marks, in NFC too
        "ana@उदाहरण.भारत",
        "mi\u200cna@example.com",  # a ZWNJ, as Persian names have
        "ana@exa\u00admple.com",  # a soft hyphen
        "n\u0303\u0301o@example.com",  # a mark NFC has no composed letter for
    ],
)
def test_a_mark_or_format_character_left_after_nfc_is_part_of_an_address(address):
    """As their JSON escapes already were: no part of the address is left before ``[email]``."""
    assert scrub.text(f"to {address} ok") == "to [email] ok"


def test_a_configured_secret_is_found_in_either_form():
    secret = "pässwörd-of-the-broker"
    for configured in (secret, _nfd(secret)):
        scrubber = Scrubber(secrets=[configured])
        for written in (secret, _nfd(secret)):
            assert scrubber.text(f"login with {written} failed") == "login with [secret] failed"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "Renée called +44 20 7946 0958 about order 73905561427",
            "Renée called [phone] about order 73905561427",
        ),
        ("Zoë's card 4111 1111 1111 1111, NIE Y-4829173-S", "Zoë's card [card], NIE [id_number]"),
        ("café at 81.2.69.142 on 2026-11-02", "café at [ip] on 2026-11-02"),
    ],
)
def test_numbers_in_decomposed_text_are_found_as_before_and_the_text_comes_back_composed(text, expected):
    assert scrub.text(_nfd(text)) == expected
    assert scrub.text(text) == expected


def test_ordinary_ascii_and_composed_text_is_returned_as_it_is():
    line = "job_succeeded actor=send_email queue=emails duration_ms=12.3"
    assert scrub.text(line) is line
    composed = "Renée's report for café Zoë is ready"
    assert scrub.text(composed) == composed
