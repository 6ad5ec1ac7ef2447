"""Replay from the dead letters, without RabbitMQ: a stand-in reader holds the dead letters and a
stand-in bulk send records what is published; what matters is what goes where and what is acked."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any

import pika
import pytest
from click.testing import CliRunner
from dramatiq import Message

from jobctl import dlq
from jobsystem.ops import dead_letters as ops
from jobsystem.ops.dead_letter_reader import DeadLetter


class _Queues:
    """Dead-letter queues of dead letters, what was acked and what was published."""

    def __init__(self, letters: dict[str, list[DeadLetter]]) -> None:
        self.letters = letters
        self.acked: list[int] = []
        self.published: list[Message[Any]] = []

    def reader(self, broker: Any) -> Any:
        queues = self

        class Reader:
            failure: str | None = None  # why a settle failed (never here)

            def __enter__(self) -> Reader:
                return self

            def __exit__(self, *exc: object) -> None:
                pass

            def stream(self, name: str) -> Any:
                for tag, dead in enumerate(queues.letters[name], 1):
                    yield dead, tag

            def ack(self, tag: int) -> None:
                queues.acked.append(tag)

            def settle(self, name: str) -> bool:
                return True

            def queue_exists(self, name: str) -> bool:
                return True

        return Reader()

    def send_bulk(self, messages: list[Message[Any]], *, broker: Any) -> list[Message[Any]]:
        self.published += messages
        return messages


@pytest.fixture
def queues(monkeypatch: pytest.MonkeyPatch) -> Any:
    def make(letters: dict[str, list[DeadLetter]]) -> _Queues:
        made = _Queues(letters)
        monkeypatch.setattr(ops, "Reader", made.reader)
        monkeypatch.setattr(ops, "send_bulk", made.send_bulk)
        return made

    return make


def _dead(dead_letter_queue: str, body: bytes, headers: dict[str, Any], message_id: str) -> DeadLetter:
    properties = pika.BasicProperties(message_id=message_id, headers=headers)
    return DeadLetter.from_delivery(dead_letter_queue, properties, body)


#: A broker of the environment ``p-`` without a dead-letter index, whose actor uses ``p-work``.
NO_INDEX = SimpleNamespace(
    dead_letter_index=None,
    actors={"job": SimpleNamespace(queue_name="p-work")},
    environment="p-",
    middleware=[],
)


def test_a_dead_letter_is_replayed_into_its_own_queue_whatever_its_headers_name(queues):
    """A dead letter in this environment's ``p-work.DLQ`` whose record names another queue (put
    there by hand, or moved from another environment's) goes back to ``p-work``, never into a
    queue this environment's tools were not asked to touch."""
    message: Message[Any] = Message("p-work", "job", (), {}, {})
    headers = {"x-dl-reason": "retries_exhausted", "x-dl-queue": "staging-work"}
    made = queues({"p-work.DLQ": [_dead("p-work.DLQ", message.encode(), headers, message.message_id)]})
    outcome = ops.replay(NO_INDEX, ["p-work.DLQ"], ops.Filters())  # type: ignore[arg-type]
    assert outcome.done == 1 and [m.queue_name for m in made.published] == ["p-work"]


NOT_MESSAGES = [
    b"\xff not a message",
    b'{"queue_name": "p-work", "actor_name": "job", "args": [], "kwargs": {}, "options": [],'
    b' "message_id": "m", "message_timestamp": 1}',
    Message("p-work", "job", (), {}, {"replays": "twice"}).encode(),
]


@pytest.mark.parametrize("body", NOT_MESSAGES)
def test_a_dead_letter_whose_body_is_not_a_message_is_kept_and_the_others_replayed(queues, body):
    """Its record says it failed as a message, but its body is not one (it does not decode, or
    Dramatiq decodes it but the worker would refuse it): it is skipped, kept in its queue, and
    the dead letters after it are replayed all the same."""
    good: Message[Any] = Message("p-work", "job", (), {}, {})
    letters = [
        _dead("p-work.DLQ", body, {"x-dl-reason": "retries_exhausted"}, "junk"),
        _dead("p-work.DLQ", good.encode(), {"x-dl-reason": "retries_exhausted"}, good.message_id),
    ]
    made = queues({"p-work.DLQ": letters})
    outcome = ops.replay(NO_INDEX, ["p-work.DLQ"], ops.Filters())  # type: ignore[arg-type]
    assert [m.message_id for m in made.published] == [good.message_id] and made.acked == [2]
    assert (outcome.done, outcome.skipped) == (1, 1)


class StandInContext:
    """``jobctl dlq``'s context, for a command whose operation a test replaces."""

    def __init__(self, ids: tuple[str, ...], selected: Any) -> None:
        self.ops, self.filters, self.complete = ops, ops.Filters(), True
        self.broker: Any = None
        self.queues: list[str] = []

    @contextlib.contextmanager
    def progress(self, label: str) -> Any:
        yield lambda n: None


@pytest.mark.parametrize("command", [["purge", "--all", "--yes"], ["retry", "--all"]])
def test_jobctl_says_when_rabbitmq_did_not_confirm_the_removal_and_fails(command, monkeypatch):
    note = "2 acked but not confirmed by RabbitMQ before the connection was lost"
    unsure = ops.Outcome(matched=2, done=2 if command[0] == "retry" else 0, unconfirmed=2, notes=[note])

    monkeypatch.setattr(dlq, "Context", StandInContext)
    monkeypatch.setattr(ops, "purge", lambda *args, **kwargs: unsure)
    monkeypatch.setattr(ops, "replay", lambda *args, **kwargs: unsure)
    result = CliRunner().invoke(dlq.dlq, command)
    assert result.exit_code == 1 and note in result.output
