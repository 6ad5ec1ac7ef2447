"""What `jobctl dlq show` and `export` print of a dead letter, and the dead letter as the readers
parse it: positional arguments hidden wherever a message travels in the body, no body whole on
the terminal, and no body or header shape that crashes a reader."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any
from unittest import mock

import pika
import pytest
from click.testing import CliRunner
from dramatiq import Message

from jobctl import dlq
from jobsystem.ops import dead_letters as ops
from jobsystem.ops.dead_letter_reader import DeadLetter


def _dead(body: bytes, headers: dict[str, Any] | None = None, message_id: str = "m1") -> DeadLetter:
    properties = pika.BasicProperties(message_id=message_id, headers=headers)
    return DeadLetter.from_delivery("p-work.DLQ", properties, body)


def _export_to_terminal(dead: DeadLetter, *command: str) -> str:
    """`jobctl dlq export` (no -o), or ``command``, over ``dead`` alone, without RabbitMQ."""

    class OneDeadLetter:
        def __init__(self, ids: tuple[str, ...], selected: Any, reading: bool = False) -> None:
            self.ops, self.broker, self.filters = ops, None, ops.Filters()
            self.queues, self.complete = [dead.dead_letter_queue], True

    with (
        mock.patch.object(dlq, "Context", OneDeadLetter),
        mock.patch.object(ops, "read", lambda broker, queues, filters: iter([dead])),
    ):
        result = CliRunner().invoke(dlq.dlq, list(command or ["export"]))
    assert result.exception is None, result.output
    return result.output


def test_export_to_the_terminal_never_writes_a_body_whole_not_even_in_base64():
    """A body that is not UTF-8 (Latin-1 JSON) is not shown; its base64 would show it all the same."""
    body = '{"args": ["José López", "+34 600 000 000"]}'.encode("latin-1")
    output = _export_to_terminal(_dead(body, {"x-dl-reason": "malformed", "x-dl-queue": "p-work"}))
    (line,) = [line for line in output.splitlines() if line.startswith("{")]
    record = json.loads(line)
    assert "not shown" in record["body"] and "body_base64" not in record


@pytest.mark.parametrize("command", [["list"], ["list", "--json"], ["show", "m1"], ["export"]])
def test_jobctl_never_prints_the_senders_text_as_the_actor(command):
    """A letter whose header names no actor (from before the records checked it, or by hand)."""
    output = _export_to_terminal(
        _dead(b"\xff", {"x-dl-reason": "unknown_actor", "x-dl-actor": "Ana Lopez"}), *command
    )
    assert "Ana" not in output and "unknown" in output


def test_the_messages_a_body_carries_have_their_positional_arguments_hidden_too():
    """A workflow member carries its next steps (option ``workflow.next``), a Dramatiq pipeline
    step its target (``pipe_target``): whole messages, arguments included."""
    summary: Message[Any] = Message(
        queue_name="p-work",
        actor_name="campaign_summary",
        args=("spring", "Ana Lopez"),
        kwargs={"name": "Ana Lopez"},
        options={"idempotency_key": "Ana Lopez|summary"},
    )
    later: Message[Any] = Message(
        queue_name="p-work", actor_name="archive", args=("Ana Lopez",), kwargs={}, options={}
    )
    nested = summary.copy(options={"pipe_target": later.asdict()})
    body = Message(
        queue_name="p-work",
        actor_name="send_email",
        args=("Ana Lopez",),
        kwargs={},
        options={
            "workflow": {"id": "w", "step": 0, "pipe": "value", "next": [nested.asdict()]},
            "pipe_target": summary.asdict(),
            "idempotency_key": "Ana Lopez|welcome",
        },
    ).encode()
    shown = dlq._shown(body)
    assert "Ana" not in shown and "Lopez" not in shown
    view = json.loads(shown)
    assert view["options"]["pipe_target"]["args"] == "<2 positional, hidden>"
    (step,) = view["options"]["workflow"]["next"]
    assert step["actor_name"] == "campaign_summary" and step["options"]["pipe_target"]["args"] == (
        "<1 positional, hidden>"
    )


@pytest.mark.parametrize("kwargs", [[["name", "Ana Lopez"]], "Ana Lopez", 5, None])
def test_a_malformed_body_whose_keyword_arguments_are_not_an_object_is_shown(kwargs):
    """The consumer dead-letters such a body as malformed; Dramatiq's decoder still takes it."""
    body = json.dumps(
        {
            "queue_name": "p-work",
            "actor_name": "send_email",
            "args": [],
            "kwargs": kwargs,
            "options": {},
            "message_id": "m1",
            "message_timestamp": 1,
        }
    ).encode()
    shown = dlq._shown(body)
    assert "Ana" not in shown and json.loads(shown)["actor_name"] == "send_email"


ODD_HEADERS = [
    {"x-dl-reason": "rejected", "x-dl-error": 5, "x-dl-actor": 7, "x-dl-queue": 9, "x-dl-exception": ["E"]},
    {"x-dl-reason": None, "x-dl-traceback": {"frame": 1}, "x-dl-attempts": "3"},
    {"x-dl-reason": "rejected", "x-dl-failed-at": "2026-01-01T00:00:00", "x-dl-enqueued-at": 5},
    {"x-death": ["not a table"]},
    {"x-death": [{"count": "two", "queue": 5, "reason": 3, "time": "noon"}]},
    {"x-death": {"queue": "p-work"}},
]


@pytest.mark.parametrize("headers", ODD_HEADERS)
@pytest.mark.parametrize("body", [b"\xff junk", Message("p-work", "job", (), {}, {}).encode()])
def test_odd_headers_never_crash_a_reader(headers, body):
    """Whatever was published into a dead-letter queue by hand, every reader gets text where it
    expects text: list, show, export, the filters, a re-index."""
    dead = _dead(body, headers)
    for name in ("queue", "actor", "reason", "exception", "error", "traceback"):
        assert isinstance(getattr(dead, name), str), name
    assert dead.queue == "p-work" and dead.reason
    for filters in (ops.Filters(since=datetime(2020, 1, 1, tzinfo=UTC)), ops.Filters(actor="job")):
        filters.match(dead)
    json.dumps(dead.full())
    entry = dead.index_entry()
    assert isinstance(entry.reason, str) and isinstance(entry.error, str)
