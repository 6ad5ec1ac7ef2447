"""What ``before_send`` does to a Sentry event, field by field (the worker test sends real ones)."""

from __future__ import annotations

import copy
import json

from actors.sentry import scrub_event
from middleware.scrub import Scrubber
from tests.pii_corpus import free_text, keyed, leaks

MESSAGE_REPR = (
    "<MessageProxy Message(queue_name='q', actor_name='bill', args=('Ana Lucia Lopez',), kwargs={})>"
)


def _event():
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
            "dramatiq": {
                "type": "dramatiq",
                "data": {
                    "queue_name": "emails",
                    "actor_name": "bill",
                    "message_id": "m-1",
                    "args": ["Ana Lucia Lopez"],
                    "kwargs": keyed(),
                    "options": {"traceback": f"RuntimeError: {free_text()}"},
                },
            },
        },
        "exception": {
            "values": [
                {
                    "type": "RuntimeError",
                    "value": free_text(),
                    "stacktrace": {
                        "frames": [
                            {
                                "module": "dramatiq.worker",
                                "function": "process_message",
                                "vars": {"message": MESSAGE_REPR},
                            },
                            {
                                "module": "actors.billing",
                                "function": "bill",
                                "vars": {**keyed(), "note": repr(free_text())},
                            },
                        ]
                    },
                }
            ]
        },
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
    out = scrub_event(Scrubber(), copy.deepcopy(event))
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
    assert out["user"] == {"email": "[email]", "ip_address": "[address]"}
    assert out["request"]["headers"] == {"Authorization": "[authorization]", "Cookie": "[cookie]"}


def test_job_arguments_and_dramatiq_frame_locals_are_removed_outright():
    out = scrub_event(Scrubber(), _event())
    data = out["contexts"]["dramatiq"]["data"]
    assert data["args"] == data["kwargs"] == "[removed]"
    assert data["options"]["traceback"].startswith("RuntimeError: Customer wrote: [email]")
    dramatiq_frame, actor_frame = out["exception"]["values"][0]["stacktrace"]["frames"]
    assert "vars" not in dramatiq_frame  # a message repr hides a name in a positional argument
    assert actor_frame["vars"]["full_name"] == "[name]" and actor_frame["vars"]["email"] == "[email]"


def test_event_is_tagged_with_the_job():
    out = scrub_event(Scrubber(), _event())
    assert out["tags"] == {"region": "eu", "actor": "bill", "queue": "emails", "message_id": "m-1"}


def test_an_event_that_cannot_be_scrubbed_is_dropped_not_sent():
    assert scrub_event(Scrubber(), {"contexts": "not a mapping", "message": free_text()}) is None
