"""Dead letters read from their queues: one ``basic.get`` at a time, each one's record parsed.

A dead-letter queue is read *without acking*: nothing leaves the queue unless an operation acks
it (:mod:`jobsystem.ops.dead_letters`), and whatever is left unacked goes back in its place when
the connection closes. RabbitMQ holds the unacked messages, the reader one at a time, so memory
stays flat however long the queue is (a consumer with an open prefetch would let the client
library buffer the whole queue faster than it is read).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import functools
from collections.abc import Container, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pika
import pika.adapters.blocking_connection
import pika.exceptions
import pika.spec
from dramatiq import Message

from jobsystem.rabbitmq.broker import DEAD_LETTER_SUFFIX, ProjectBroker
from jobsystem.rabbitmq.dead_letter_indexer import replays_of
from jobsystem.runtime.actor_names import UNKNOWN_ACTOR, actor_label
from jobsystem.runtime.connecting import open_connection
from jobsystem.runtime.message_shape import decode, int_option
from jobsystem.store.dead_letter_index import DeadLetterEntry
from middleware import dead_letters as record

__all__ = ["RESET_OPTIONS", "DeadLetter", "Reader"]

#: Options a replayed message starts without: it gets a fresh set of attempts.
RESET_OPTIONS = ("retries", record.ATTEMPTS, "traceback", "eta", "requeue_timestamp")


def _header(headers: Any, name: str) -> str:
    """Header ``name`` as text; "" when it is missing or not text (anyone may publish into a
    dead-letter queue, so a header can hold any AMQP type: the readers expect text)."""
    value = headers.get(name) if isinstance(headers, dict) else None
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value if isinstance(value, str) else ""


def _stamp(headers: dict[str, Any]) -> str | None:
    """The environment stamped on a record (the empty prefix is a stamp too); None when missing
    or not text."""
    if record.HEADER_ENVIRONMENT not in headers:
        return None
    value = headers[record.HEADER_ENVIRONMENT]
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value if isinstance(value, str) else None


def _from_millis(millis: int) -> datetime | None:
    try:
        return datetime.fromtimestamp(millis / 1000, UTC)
    except (OverflowError, OSError, ValueError):
        return None


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _parse_time(value: Any) -> datetime | None:
    """A time, in UTC when it does not say (``--since`` compares it with aware times)."""
    if isinstance(value, str) and value:
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    return None


@dataclass(frozen=True)
class DeadLetter:
    """One dead letter as read from its queue: the record of its failure and its body."""

    dead_letter_queue: str
    message_id: str
    queue: str
    actor: str
    reason: str
    exception: str
    error: str
    traceback: str
    attempts: int
    enqueued_at: datetime | None
    failed_at: datetime | None
    body: bytes = field(repr=False)
    #: The ``QUEUE_PREFIX`` of the environment whose worker dead-lettered it (``x-dl-environment``,
    #: stamped on every record the project writes); None: not stamped, i.e. written by the release
    #: before the stamp, by RabbitMQ's own dead-lettering (``x-death``) or by another application.
    environment: str | None = None

    @classmethod
    def from_delivery(
        cls,
        dead_letter_queue: str,
        properties: pika.spec.BasicProperties,
        body: bytes,
        actors: Container[str] | None = None,
    ) -> DeadLetter:
        """Read the project's ``x-dl-*`` record (with the ``environment`` that wrote it), or
        RabbitMQ's ``x-death`` for a body it dead-lettered itself (an undecodable one). Its queue
        is the one whose dead-letter queue holds it, not one its headers name: a replay never
        leaves the queues the operator chose. ``actors``: the broker's, which alone tell a body's
        actor name from the sender's text where no worker checked it (``x-death`` only);
        ``x-dl-actor`` was checked by the worker that wrote it."""
        headers: dict[str, Any] = dict(properties.headers or {})
        origin = dead_letter_queue.removesuffix(DEAD_LETTER_SUFFIX)
        if record.HEADER_REASON in headers:
            return cls(
                dead_letter_queue=dead_letter_queue,
                message_id=properties.message_id or "",
                queue=origin,
                actor=actor_label(_header(headers, record.HEADER_ACTOR)),
                reason=_header(headers, record.HEADER_REASON) or "rejected",
                exception=_header(headers, record.HEADER_EXCEPTION),
                error=_header(headers, record.HEADER_ERROR),
                traceback=_header(headers, record.HEADER_TRACEBACK),
                attempts=_count(headers.get(record.HEADER_ATTEMPTS)),
                enqueued_at=_parse_time(_header(headers, record.HEADER_ENQUEUED_AT)),
                failed_at=_parse_time(_header(headers, record.HEADER_FAILED_AT)),
                body=body,
                environment=_stamp(headers),
            )
        deaths = headers.get("x-death")
        death = deaths[0] if isinstance(deaths, list) and deaths and isinstance(deaths[0], dict) else {}
        message = decode(body, None)
        if isinstance(message, Message):
            message_id, actor, reason = (
                message.message_id,
                actor_label(message.actor_name, actors),
                _header(death, "reason") or "rejected",
            )
            enqueued = _from_millis(message.message_timestamp)
        else:
            message_id, reason, enqueued = properties.message_id or "", "undecodable", None
            actor = UNKNOWN_ACTOR
        return cls(
            dead_letter_queue=dead_letter_queue,
            message_id=message_id,
            queue=origin,
            actor=actor,
            reason=reason,
            exception="DecodeError" if reason == "undecodable" else "",
            error="the body could not be decoded as a message" if reason == "undecodable" else "",
            traceback="",
            attempts=_count(death.get("count")) if reason != "undecodable" else 0,
            enqueued_at=enqueued,
            failed_at=_parse_time(death.get("time")),
            body=body,
        )

    @functools.cached_property
    def replays(self) -> int | None:
        """How many times its job had been replayed from the dead letters when it failed (its
        body's option ``replays``; 0 when not set), None for a body that is not a message. A replay
        counts one more, so a replay that fails again is a newer dead letter of the same message
        id with one replay more."""
        return replays_of(self.body)

    def summary(self) -> dict[str, Any]:
        """The record without traceback and body (``list``)."""
        return {
            "message_id": self.message_id,
            "queue": self.queue,
            "actor": self.actor,
            "reason": self.reason,
            "exception": self.exception,
            "error": self.error,
            "attempts": self.attempts,
            # How many times it was replayed (None: not a message): what ``purge --replays`` takes.
            "replays": self.replays,
            "enqueued_at": self.enqueued_at.isoformat() if self.enqueued_at else None,
            "failed_at": self.failed_at.isoformat() if self.failed_at else None,
        }

    def full(self) -> dict[str, Any]:
        """Everything, the body included as text (``show``, ``export``); a body that is not UTF-8
        also as ``body_base64``, byte for byte."""
        data = {**self.summary(), "traceback": self.traceback, "body": self.body.decode(errors="replace")}
        try:
            self.body.decode()
        except UnicodeDecodeError:
            data["body_base64"] = base64.b64encode(self.body).decode()
        return data

    def index_entry(self) -> DeadLetterEntry:
        """The dead letter as the index keeps it."""

        def millis(moment: datetime | None) -> int | None:
            return int(moment.timestamp() * 1000) if moment is not None else None

        return DeadLetterEntry(
            queue=self.queue,
            message_id=self.message_id,
            actor=self.actor,
            reason=self.reason,
            exception=self.exception,
            error=self.error[:1_000],
            traceback=self.traceback[-4_000:],
            attempts=self.attempts,
            enqueued_at=millis(self.enqueued_at),
            failed_at=millis(self.failed_at) or 0,
            replays=self.replays,
        )

    def replay_message(self) -> Message[Any] | None:
        """The message to publish again: original queue, attempts reset, same id and key, and
        one more replay counted (its status then moves on from ``dead``); None for a body that is
        not a well-formed message, whatever its headers say (the worker would only dead-letter it
        again). A well-formed body may hold any known option as null (the shape check lets null
        mean "not set"), so ``replays`` is read as a count that is absent when not an integer: one
        such letter must not stop the replay of every letter after it."""
        message = decode(self.body, None)
        if not isinstance(message, Message):
            return None
        options = {k: v for k, v in message.options.items() if k not in RESET_OPTIONS}
        options[record.REPLAYS] = int_option(message.options, record.REPLAYS) + 1
        return dataclasses.replace(message, queue_name=self.queue, options=options)


class Reader:
    """One AMQP connection that streams dead-letter queues without acking (see the module doc)."""

    def __init__(self, broker: ProjectBroker) -> None:
        parameters = broker.parameters[0] if isinstance(broker.parameters, list) else broker.parameters
        self.connection = open_connection(parameters)  # a hung RabbitMQ: an AMQPConnectionError
        #: The actors declared in this process (the project's, and the ``--module`` ones).
        self.actors = broker.actors
        self.channel = self.connection.channel()
        #: The class of the error that made :meth:`settle` answer False (None until one did).
        self.failure: str | None = None

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def count(self, dead_letter_queue: str) -> int:
        return int(self.channel.queue_declare(dead_letter_queue, passive=True).method.message_count)

    def stream(self, dead_letter_queue: str) -> Iterator[tuple[DeadLetter, int]]:
        """Each dead letter there was when the stream started, with its delivery tag to ack."""
        for _ in range(self.count(dead_letter_queue)):
            method, properties, body = self.channel.basic_get(dead_letter_queue, auto_ack=False)
            if method is None:  # the queue shrank under us (another operator purged it)
                return
            dead = DeadLetter.from_delivery(dead_letter_queue, properties, body, self.actors)
            yield dead, method.delivery_tag

    def ack(self, tag: int) -> None:
        """Ack a dead letter: sent, not yet known to be done (an ack has no reply; see :meth:`settle`)."""
        self.channel.basic_ack(tag)

    def settle(self, dead_letter_queue: str) -> bool:
        """Whether RabbitMQ processed every ack sent so far: a synchronous round trip on the same
        channel (a passive declare), whose reply comes only after the methods before it, acks
        included. False when the connection or channel was lost first: the acks may not have
        arrived, and their letters may be back in their queue (this reader is then unusable).
        A 404 (the queue was deleted meanwhile) is a reply too, after the acks: settled; it
        closed the channel, so the reader goes on with a new one."""
        try:
            self.count(dead_letter_queue)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code != 404:  # closed for an earlier method: the acks may be lost
                self.failure = type(exc).__name__
                return False
            with contextlib.suppress(pika.exceptions.AMQPError):  # lost now: the next read says so
                self.channel = self.connection.channel()
        except pika.exceptions.AMQPError as exc:
            self.failure = type(exc).__name__
            return False
        return True

    def queue_exists(self, name: str) -> bool:
        """Whether RabbitMQ has queue ``name``, asked on a channel of its own (a missing queue
        closes the channel that asked)."""
        channel = self.connection.channel()
        try:
            channel.queue_declare(name, passive=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code != 404:
                raise
            return False
        channel.close()
        return True

    def close(self) -> None:
        """Close the connection, which hands every unacked dead letter back to its queue, in place.
        A connection lost meanwhile (or while closing) has done so already, or RabbitMQ does when
        it notices: an error closing it must not hide the one that stopped the operation."""
        if self.connection.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError):
                self.connection.close()
