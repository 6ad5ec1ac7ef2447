"""Operations on the dead-letter queues: read, filter, replay and purge, streaming.

A dead-letter queue is read one ``basic.get`` at a time *without acking*: nothing leaves the
queue unless an operation acks it, and whatever is left unacked goes back in its place when the
connection closes. RabbitMQ holds the unacked messages, the reader one at a time, so memory stays
flat however long the queue is (a consumer with an open prefetch would let the client library
buffer the whole queue faster than it is read).

Replay publishes a copy to the original queue (attempts reset; same message id and idempotency
key), waits for RabbitMQ's confirms, and only then acks the dead letter. A crash in between leaves
the dead letter in place: replaying it again duplicates at worst, and the idempotency key makes
the duplicate harmless. Bodies that are not well-formed messages (reason ``malformed``, or
``undecodable`` from before the consumer checked shapes) are not replayed: they would only be
dead-lettered again. Their sender needs fixing; ``export`` keeps them for that.

Whatever an operation removes from a queue it also removes from the dead-letter index in the
state store (``middleware.dead_letter_index``), which the dashboard lists; :func:`reindex` builds
a queue's index again from the queue itself.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import pika
import pika.adapters.blocking_connection
import pika.spec
import requests
from dramatiq import Message
from dramatiq.common import q_name

from actors.broker import DEAD_LETTER_SUFFIX, ProjectBroker
from actors.bulk import BulkSendError, send_bulk
from actors.settings import Settings
from middleware import dead_letters as record
from middleware.dead_letter_index import DeadLetterEntry
from middleware.message_shape import decode
from middleware.state import StoreUnavailable

logger = logging.getLogger(__name__)

#: Options a replayed message starts without: it gets a fresh set of attempts.
RESET_OPTIONS = ("retries", record.ATTEMPTS, "traceback", "eta", "requeue_timestamp")
#: Reasons of dead letters that are not messages at all: never replayed.
NOT_REPLAYABLE = ("malformed", "undecodable")


def _header(headers: dict[str, Any], name: str) -> Any:
    value = headers.get(name)
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _from_millis(millis: int) -> datetime | None:
    try:
        return datetime.fromtimestamp(millis / 1000, UTC)
    except (OverflowError, OSError, ValueError):
        return None


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _parse_time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            return None
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

    @classmethod
    def from_delivery(
        cls, dead_letter_queue: str, properties: pika.spec.BasicProperties, body: bytes
    ) -> DeadLetter:
        """Read the project's ``x-dl-*`` record, or RabbitMQ's ``x-death`` for a body it dead-lettered
        itself (an undecodable one)."""
        headers: dict[str, Any] = dict(properties.headers or {})
        origin = dead_letter_queue.removesuffix(DEAD_LETTER_SUFFIX)
        if record.HEADER_REASON in headers:
            return cls(
                dead_letter_queue=dead_letter_queue,
                message_id=properties.message_id or "",
                queue=_header(headers, record.HEADER_QUEUE) or origin,
                actor=_header(headers, record.HEADER_ACTOR) or "",
                reason=_header(headers, record.HEADER_REASON),
                exception=_header(headers, record.HEADER_EXCEPTION) or "",
                error=_header(headers, record.HEADER_ERROR) or "",
                traceback=_header(headers, record.HEADER_TRACEBACK) or "",
                attempts=_count(headers.get(record.HEADER_ATTEMPTS)),
                enqueued_at=_parse_time(_header(headers, record.HEADER_ENQUEUED_AT)),
                failed_at=_parse_time(_header(headers, record.HEADER_FAILED_AT)),
                body=body,
            )
        deaths = headers.get("x-death") or [{}]
        death = deaths[0] if isinstance(deaths, list) and deaths else {}
        message = decode(body, None)
        if isinstance(message, Message):
            message_id, actor, reason = (
                message.message_id,
                message.actor_name,
                _header(death, "reason") or "rejected",
            )
            enqueued = _from_millis(message.message_timestamp)
        else:
            message_id, actor, reason, enqueued = properties.message_id or "", "", "undecodable", None
        return cls(
            dead_letter_queue=dead_letter_queue,
            message_id=message_id,
            queue=q_name(_header(death, "queue") or origin),
            actor=actor,
            reason=reason,
            exception="DecodeError" if reason == "undecodable" else "",
            error="the body could not be decoded as a message" if reason == "undecodable" else "",
            traceback="",
            attempts=int(death.get("count") or 0) if reason != "undecodable" else 0,
            enqueued_at=enqueued,
            failed_at=_parse_time(death.get("time")),
            body=body,
        )

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
        )

    def replay_message(self) -> Message[Any]:
        """The message to publish again: original queue, attempts reset, same id and key, and
        one more replay counted (its status then moves on from ``dead``)."""
        message = Message.decode(self.body)
        options = {k: v for k, v in message.options.items() if k not in RESET_OPTIONS}
        options[record.REPLAYS] = int(message.options.get(record.REPLAYS, 0)) + 1
        return dataclasses.replace(message, queue_name=self.queue, options=options)


@dataclass(frozen=True)
class Filters:
    """Which dead letters an operation applies to; empty fields match everything."""

    message_ids: frozenset[str] = frozenset()
    queue: str | None = None
    actor: str | None = None
    exception: str | None = None
    since: datetime | None = None

    def match(self, dead: DeadLetter) -> bool:
        return (
            (not self.message_ids or dead.message_id in self.message_ids)
            and (self.queue is None or dead.queue == self.queue)
            and (self.actor is None or dead.actor == self.actor)
            and (self.exception is None or dead.exception == self.exception)
            and (self.since is None or (dead.failed_at is not None and dead.failed_at >= self.since))
        )


def dead_letter_queues(settings: Settings, broker: ProjectBroker, queue: str | None = None) -> list[str]:
    """The dead-letter queues of this environment (``QUEUE_PREFIX``), from the management API,
    or from the queues this process declared when the API does not answer."""
    if queue is not None:
        return [q_name(queue) + DEAD_LETTER_SUFFIX]
    vhost = quote(settings.rabbitmq_vhost, safe="")
    try:
        response = requests.get(
            f"{settings.management_url}/api/queues/{vhost}", params={"columns": "name"}, timeout=10
        )
        response.raise_for_status()
        names = [q["name"] for q in response.json()]
    except requests.RequestException:
        names = [q + DEAD_LETTER_SUFFIX for q in broker.get_declared_queues()]
    return sorted(n for n in names if n.endswith(DEAD_LETTER_SUFFIX) and n.startswith(settings.queue_prefix))


class Reader:
    """One AMQP connection that streams dead-letter queues without acking (see the module doc)."""

    def __init__(self, broker: ProjectBroker) -> None:
        parameters = broker.parameters[0] if isinstance(broker.parameters, list) else broker.parameters
        self.connection = pika.BlockingConnection(parameters)
        self.channel = self.connection.channel()

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
            yield DeadLetter.from_delivery(dead_letter_queue, properties, body), method.delivery_tag

    def ack(self, tag: int) -> None:
        self.channel.basic_ack(tag)

    def close(self) -> None:
        # Closing the channel hands every unacked dead letter back to its queue, in place.
        if self.connection.is_open:
            self.connection.close()


@dataclass
class Outcome:
    """What an operation did, for its summary line."""

    matched: int = 0
    done: int = 0
    skipped: int = 0
    failed: int = 0
    notes: list[str] = field(default_factory=list)


Progress = Callable[[int], None]


def _noop(_: int) -> None:
    pass


def replay(
    broker: ProjectBroker,
    queues: list[str],
    filters: Filters,
    *,
    batch_size: int = 500,
    progress: Progress = _noop,
) -> Outcome:
    """Publish the matching dead letters back to their queues, then remove them."""
    outcome = Outcome()
    with Reader(broker) as reader:
        for dead_letter_queue in queues:
            batch: list[tuple[Message[Any], int, DeadLetter]] = []
            for dead, tag in reader.stream(dead_letter_queue):
                progress(1)
                if not filters.match(dead):
                    continue
                outcome.matched += 1
                if dead.reason in NOT_REPLAYABLE:
                    outcome.skipped += 1
                    continue
                batch.append((dead.replay_message(), tag, dead))
                if len(batch) >= batch_size:
                    _publish_then_ack(broker, reader, batch, outcome)
                    batch = []
            _publish_then_ack(broker, reader, batch, outcome)
    if outcome.skipped:
        outcome.notes.append(
            f"{outcome.skipped} malformed, not replayed (fix the sender; export or purge them)"
        )
    return outcome


def _publish_then_ack(
    broker: ProjectBroker,
    reader: Reader,
    batch: list[tuple[Message[Any], int, DeadLetter]],
    outcome: Outcome,
) -> None:
    if not batch:
        return
    try:
        send_bulk([m for m, _, _ in batch], broker=broker)
        confirmed = {m.message_id for m, _, _ in batch}
    except BulkSendError as error:
        confirmed = {m.message_id for m in error.confirmed}
        outcome.failed += len(error.failed)
        outcome.notes.append(str(error))
    removed = []
    for message, tag, dead in batch:
        if message.message_id in confirmed:
            reader.ack(tag)
            removed.append(dead)
            outcome.done += 1
    forget(broker, removed)


def forget(broker: ProjectBroker, removed: list[DeadLetter]) -> None:
    """Take dead letters removed from their queue out of the index; a store that does not answer
    leaves them listed (the dashboard shows the index and RabbitMQ disagree, a re-index fixes it)."""
    index = broker.dead_letter_index
    if index is None or not removed:
        return
    try:
        index.backend.remove([(dead.queue, dead.message_id) for dead in removed])
    except StoreUnavailable as exc:
        logger.warning("dead_letter_index_stale", extra={"removed": len(removed), "error": str(exc)})


def purge(
    broker: ProjectBroker, queues: list[str], filters: Filters, *, progress: Progress = _noop
) -> Outcome:
    """Remove the matching dead letters for good."""
    outcome = Outcome()
    removed: list[DeadLetter] = []
    with Reader(broker) as reader:
        for dead_letter_queue in queues:
            for dead, tag in reader.stream(dead_letter_queue):
                progress(1)
                if filters.match(dead):
                    reader.ack(tag)
                    removed.append(dead)
                    outcome.matched += 1
                    outcome.done += 1
                if len(removed) >= 500:
                    forget(broker, removed)
                    removed = []
    forget(broker, removed)
    return outcome


def reindex(broker: ProjectBroker, dead_letter_queue: str) -> int:
    """Rebuild the index of one dead-letter queue from the queue itself (a full read, nothing
    removed); returns how many it holds. Dead letters that arrive during the read may be left
    out: run it again if the counts still disagree."""
    index = broker.dead_letter_index
    if index is None:
        return 0
    with Reader(broker) as reader:
        entries = [dead.index_entry() for dead, _ in reader.stream(dead_letter_queue)]
    index.replace(dead_letter_queue.removesuffix(DEAD_LETTER_SUFFIX), entries)
    return len(entries)


def read(broker: ProjectBroker, queues: list[str], filters: Filters) -> Iterator[DeadLetter]:
    """The matching dead letters, streamed; none is removed."""
    with Reader(broker) as reader:
        for dead_letter_queue in queues:
            for dead, _ in reader.stream(dead_letter_queue):
                if filters.match(dead):
                    yield dead


def total(broker: ProjectBroker, queues: list[str]) -> int:
    """How many dead letters the queues hold now (for progress bars)."""
    with Reader(broker) as reader:
        return sum(reader.count(q) for q in queues)


def to_json_line(data: dict[str, Any]) -> str:
    return json.dumps(data, ensure_ascii=False, default=str)
