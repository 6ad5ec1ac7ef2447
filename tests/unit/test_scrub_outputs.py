"""Where scrubbed text leaves the project: the structlog processor and the standard library's filter
and records, the CLI's stream and JSON output, `jobctl dlq show` and `jobctl status`, and the
traceback handed to an on-retry-exhausted hook."""

from __future__ import annotations

import logging

from jobsystem.privacy.scrub import Scrubber

scrub = Scrubber()


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
