"""What ``before_send`` does to a Sentry event, field by field (the worker test sends real ones)."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from jobsystem.observability.sentry import scrub_event
from jobsystem.privacy.scrub import Scrubber
from tests.pii_corpus import free_text, keyed, leaks

if TYPE_CHECKING:
    from dramatiq import Message
    from sentry_sdk.types import Event

MESSAGE_REPR = (
    "<MessageProxy Message(queue_name='q', actor_name='bill', args=('Ana Lucia Lopez',), kwargs={})>"
)


def scrubbed(event: Mapping[str, Any]) -> Any:
    """``before_send``'s answer to ``event``, built as the SDK sends one, as plain JSON: the SDK's
    ``Event`` type leaves every nested value an ``object``, which these tests read into."""
    return scrub_event(Scrubber(), cast("Event", event))


def _exception() -> dict[str, Any]:
    """A job's exception as the SDK reports it: a library frame, then one of the application's."""
    library = {
        "module": "dramatiq.worker",
        "function": "process_message",
        "in_app": False,
        "vars": {"message": MESSAGE_REPR},
    }
    application = {
        "module": "actors.billing",
        "function": "bill",
        "in_app": True,
        "vars": {**keyed(), "note": repr(free_text())},
    }
    return {
        "values": [
            {"type": "RuntimeError", "value": free_text(), "stacktrace": {"frames": [library, application]}}
        ]
    }


def _event() -> dict[str, Any]:
    job = {
        "queue_name": "emails",
        "actor_name": "bill",
        "message_id": "m-1",
        "args": ["Ana Lucia Lopez"],
        "kwargs": keyed(),
        "options": {"traceback": f"RuntimeError: {free_text()}"},
    }
    return {
        "event_id": "0b9d3c1e4f5a11ee8c900242ac120002",
        "timestamp": "2026-11-29T19:13:00.123456Z",
        "level": "error",
        "release": "jobsystem@1.2.3",
        "environment": "production",
        "server_name": "worker-1",
        "sdk": {"name": "sentry.python", "version": "2.75.0"},
        "modules": {"dramatiq": "2.2.1"},
        "tags": {"region": "eu"},
        "contexts": {
            "runtime": {"name": "CPython", "version": "3.11.7"},
            "dramatiq": {"type": "dramatiq", "data": job},
        },
        "exception": _exception(),
        "breadcrumbs": {"values": [{"category": "app", "message": free_text(), "data": keyed()}]},
        "extra": {"customer": keyed(), "sys.argv": ["dramatiq", "actors"]},
        "request": {
            "url": "https://shop.example/callback?token=abcdef123456&email=ana.lopez@example.com",
            "headers": {
                "Authorization": "Bearer mF_9.B5f-4.1JqM7tLz8Xw2",
                "Cookie": "sessionid=abc123def456",
            },
            "data": keyed(),
        },
        "user": {"email": "ana.lopez@example.com", "ip_address": "203.0.113.9"},
        "logentry": {"message": "customer %s", "params": [free_text()]},
    }


def test_no_corpus_value_survives_and_the_sdk_fields_stay():
    event = _event()
    out = scrubbed(copy.deepcopy(event))
    assert out is not None
    assert leaks(json.dumps(out)) == []
    for field in (
        "event_id",
        "timestamp",
        "level",
        "release",
        "environment",
        "sdk",
        "modules",
        "server_name",
    ):
        assert out[field] == event[field]
    assert out["contexts"]["runtime"] == event["contexts"]["runtime"]
    assert out["user"] == {"email": "[email]", "ip_address": "[ip]"}
    assert out["request"] == {"url": "/callback", "headers": {}, "data": "[removed]"}


def test_job_arguments_and_dramatiq_frame_locals_are_removed_outright():
    out = scrubbed(_event())
    data = out["contexts"]["dramatiq"]["data"]
    assert data["args"] == data["kwargs"] == "[removed]"
    assert data["options"]["traceback"].startswith("RuntimeError: Customer wrote: [email]")
    dramatiq_frame, actor_frame = out["exception"]["values"][0]["stacktrace"]["frames"]
    assert "vars" not in dramatiq_frame  # a message repr hides a name in a positional argument
    assert actor_frame["vars"]["full_name"] == "[name]" and actor_frame["vars"]["email"] == "[email]"
    assert re.fullmatch(r"\[text, \d+ chars\]", actor_frame["vars"]["note"])  # any string: its length


def _frame(module: str, in_app: bool, local_vars: dict[str, object]) -> dict[str, object]:
    return {"module": module, "function": "f", "in_app": in_app, "vars": local_vars}


def test_locals_of_library_frames_go_and_application_frames_keep_numbers_and_sizes_only():
    from urllib.parse import urlsplit

    smtp = urlsplit("smtp://mailer:Sm7p-Pa55word@smtp.example.com:587?starttls=1")
    event = {
        "exception": {
            "values": [
                {  # the cause of a chain, as the SDK sends it: its own frames and value
                    "type": "SMTPAuthenticationError",
                    "value": "(535, b'5.7.8 auth failed for mailer:Sm7p-Pa55word@smtp.example.com')",
                    "stacktrace": {
                        "frames": [
                            _frame("smtplib", False, {"password": "'Sm7p-Pa55word'", "msg": "'x'"}),
                            _frame(
                                "actors.emails",
                                True,
                                {
                                    "url": [repr(part) for part in smtp],  # how the SDK serialises it
                                    "subject": "'Welcome, Ana Lucia'",
                                    "to": "'ana.lopez@example.com'",
                                    "attempt": 2,
                                    "template": "'welcome'",
                                    "tries": "3",
                                    "ok": "True",
                                    "ratio": "-0.5",
                                    "none": "None",
                                    "by_name": {"'Ana Lucia'": "3"},
                                },
                            ),
                        ]
                    },
                }
            ]
        },
        "threads": {"values": [{"stacktrace": {"frames": [_frame("pika.channel", False, {"b": "x"})]}}]},
    }
    out = scrubbed(event)
    text = json.dumps(out)
    assert "Sm7p-Pa55word" not in text and "Ana Lucia" not in text and leaks(text) == []
    library, own = out["exception"]["values"][0]["stacktrace"]["frames"]
    assert "vars" not in library and "vars" not in out["threads"]["values"][0]["stacktrace"]["frames"][0]
    assert own["vars"]["url"] == [f"[text, {n} chars]" for n in (6, 40, 2, 12, 2)]  # the scrubbed reprs
    assert own["vars"]["subject"] == "[text, 20 chars]"
    assert own["vars"]["to"] == "[text, 9 chars]"  # '[email]': scrubbed, then summed up
    assert (own["vars"]["attempt"], own["vars"]["template"]) == (2, "[text, 9 chars]")
    assert (own["vars"]["tries"], own["vars"]["ok"], own["vars"]["ratio"], own["vars"]["none"]) == (
        "3",
        "True",
        "-0.5",
        "None",
    )  # numbers, booleans and None as the SDK wrote them
    assert own["vars"]["by_name"] == "[mapping, 1 items]"  # its keys are data too


def test_event_is_tagged_with_the_job():
    out = scrubbed(_event())
    assert out["tags"] == {"region": "eu", "actor": "bill", "queue": "emails", "message_id": "m-1"}


def test_an_event_that_cannot_be_scrubbed_is_dropped_not_sent():
    assert scrubbed({"contexts": "not a mapping", "message": free_text()}) is None


def test_structlog_events_reach_sentry_scrubbed_as_structures(logging_restored):
    """Sentry's logging integration reads a structlog record's message, which is the event dict
    itself, as ``str(dict)``: an error event's ``logentry`` and every INFO line's breadcrumb. A list
    or dict under a personal-data key is then text in brackets that no key is next to."""
    import sentry_sdk
    import structlog

    from jobsystem.observability.logs import configure_logging
    from jobsystem.observability.sentry import configure_sentry
    from jobsystem.settings import load_settings
    from tests.servers import sentry_events, sentry_server

    with sentry_server() as (dsn, envelopes):
        settings = load_settings({"SENTRY_DSN": dsn, "LOG_LEVEL": "INFO"})
        configure_logging(settings)
        configure_sentry(settings)
        try:
            log = structlog.get_logger("billing")
            log.info("address_checked", address={"line1": "12 Rue Lepic", "city": "Paris"})
            log.error("payment_failed", customer_name=("Zoë", "Lucía Gómez"), iban_holder_address=["9 Calle"])
            sentry_sdk.flush(5)
        finally:
            sentry_sdk.get_client().close()
            sentry_sdk.get_global_scope().set_client(None)
        (event,) = sentry_events(list(envelopes))
    sent = json.dumps(event, ensure_ascii=False)
    for value in ("Rue Lepic", "Paris", "Zoë", "Lucía", "9 Calle"):
        assert value not in sent, value
    assert "payment_failed" in event["logentry"]["message"] and "[name]" in event["logentry"]["message"]
    (crumb,) = [c for c in event["breadcrumbs"]["values"] if "address_checked" in c["message"]]
    assert "[address]" in crumb["message"]


def _workflow_messages() -> tuple[Message[Any], Message[Any]]:
    """A job whose later steps travel in its options: a project workflow's ``workflow.next`` and a
    Dramatiq pipeline's ``pipe_target``, each a whole message, arguments and all."""
    from dramatiq import Message

    from jobsystem.runtime.workflow_steps import Step, annotate

    report: Message[Any] = Message("reports", "make_report", ("2026-11",), {}, {})
    mail: Message[Any] = Message(
        "emails", "send_report", ("Ana Lucia Lopez",), {"ship_to": "12 Rue Lepic"}, {}
    )
    _, (member,) = annotate("pipeline", [Step([report]), Step([mail])])
    piped = report.copy(options={"pipe_target": mail.asdict()})
    return member, piped


def test_the_arguments_of_a_workflows_next_steps_do_not_reach_sentry(logging_restored):
    """The integration copies the message, options included, into ``contexts.dramatiq``: the later
    steps' arguments are job arguments as much as the job's own, which are removed outright."""
    import sentry_sdk
    from sentry_sdk.integrations.dramatiq import DramatiqIntegration, _make_message_event_processor

    from jobsystem.observability.sentry import configure_sentry
    from jobsystem.settings import load_settings
    from tests.servers import sentry_events, sentry_server

    with sentry_server() as (dsn, envelopes):
        configure_sentry(load_settings({"SENTRY_DSN": dsn}))
        try:
            integration = sentry_sdk.get_client().get_integration(DramatiqIntegration)
            assert integration is not None  # configure_sentry installs it
            for message in _workflow_messages():
                with sentry_sdk.isolation_scope() as scope:
                    scope.add_event_processor(_make_message_event_processor(message, integration))
                    sentry_sdk.capture_exception(RuntimeError("report failed"))
            sentry_sdk.flush(5)
        finally:
            sentry_sdk.get_client().close()
            sentry_sdk.get_global_scope().set_client(None)
        events = sentry_events(list(envelopes))
    assert len(events) == 2
    for event in events:
        sent = json.dumps(event)
        assert "send_report" in sent  # the next step is still named
        assert "Ana Lucia Lopez" not in sent and "12 Rue Lepic" not in sent, sent
