"""Operations on the dead-letter queues: filter, read, replay, purge and re-index, streaming.

Dead letters are read with :class:`~jobsystem.ops.dead_letter_reader.Reader`, one at a time and
without acking: nothing leaves a queue unless an operation acks it. Replay publishes a copy to the
original queue (attempts reset; same message id and idempotency key), waits for RabbitMQ's
confirms, and only then acks the dead letter. A crash in between leaves the dead letter in place:
replaying it again duplicates at worst, and the idempotency key makes the duplicate harmless (a job
without one runs twice: the copy has the same message id, nothing tells it from the first).
Bodies that are not well-formed messages (reason ``malformed``, or ``undecodable`` from before the
consumer checked shapes) are not replayed: they would only be dead-lettered again. Their sender
needs fixing; ``export`` keeps them for that. Nor is a letter whose idempotency key the send
refuses (``""``, or its actor's key function raises): it would fail the whole batch it is in.

Whatever an operation removes from a queue it also removes from the dead-letter index in the
state store (:mod:`jobsystem.store.dead_letter_index`), which the dashboard lists, once RabbitMQ
is known to have processed the acks: an ack has no reply, and acks lost with a connection leave
their letters in the queue, so the index is changed only after a synchronous round trip on the
channel that acked (:meth:`~jobsystem.ops.dead_letter_reader.Reader.settle`). A connection lost
before it, or before an ack could be sent, stops the operation, says so (``unconfirmed``) and
leaves those letters indexed. Of a replay, those letters were replayed all the same: a second
retry would publish them again under the same message id, and only a job with an idempotency
key is then skipped (its key completed), so the operation names them (``unremoved``) to purge.
:func:`reindex` builds a queue's index again from the queue itself.

An operation that cannot go on (the reader's connection lost between two letters or at an ack,
the state store down when a replay's idempotency keys are checked) ends with what it did so far,
a note naming the failure by its class and what it left, and :attr:`Outcome.stopped`: ``jobctl``
and the dashboard give the operator that summary, never a traceback
(:mod:`jobsystem.ops.dead_letter_stops`).

Retry, purge and re-index take only the letters :func:`~jobsystem.ops.scope.changeable` allows:
those stamped with this environment's ``QUEUE_PREFIX``, and unstamped ones (the release before
the stamp, RabbitMQ's own) only in an actor's queue; never another environment's or application's,
even when its queue made its way into the index or shares a name with one of this environment's.
The others stay in their queue, out of the index, and the operation says how many it left.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pika.exceptions
from dramatiq import Message
from dramatiq.common import q_name

from jobsystem.ops.dead_letter_outcome import KEY_REFUSED, MALFORMED, Outcome
from jobsystem.ops.dead_letter_reader import DeadLetter, Reader
from jobsystem.ops.dead_letter_stops import ReadStopped, Stopped, not_sent, read_only, reading, unconfirmed
from jobsystem.ops.queue_counts import missing_queues
from jobsystem.ops.scope import INDEX_UNREAD, ForeignQueue, changeable, project_queue, project_scope
from jobsystem.privacy.outage_lines import log_failure, log_outage
from jobsystem.rabbitmq.broker import DEAD_LETTER_SUFFIX, ProjectBroker
from jobsystem.rabbitmq.bulk import BulkSendError, send_bulk
from jobsystem.settings import Settings
from jobsystem.store.base import StoreUnavailable
from jobsystem.store.dead_letter_index import DeadLetterEntry
from middleware.idempotency import REGISTERED, Idempotency, IdempotencyKeyError

__all__ = [
    "INDEX_UNREAD",
    "NOT_REPLAYABLE",
    "Filters",
    "ForeignQueue",
    "Outcome",
    "ReadStopped",
    "Reindexed",
    "dead_letter_queues",
    "dead_letter_scope",
    "forget",
    "purge",
    "read",
    "reindex",
    "replay",
    "to_json_line",
    "total",
]

logger = logging.getLogger(__name__)

#: The longest the check of which dead-letter queues RabbitMQ has may take.
RABBITMQ_TIMEOUT_S = 10.0
#: Reasons of dead letters that are not messages at all: never replayed.
NOT_REPLAYABLE = ("malformed", "undecodable")


@dataclass(frozen=True)
class Filters:
    """Which dead letters an operation applies to; empty fields match everything."""

    message_ids: frozenset[str] = frozenset()
    queue: str | None = None
    actor: str | None = None
    exception: str | None = None
    since: datetime | None = None
    #: Only letters that record this many replays (:attr:`DeadLetter.replays`): those a stopped
    #: retry replayed, not a newer dead letter of the same id (one replay more).
    replays: int | None = None

    def match(self, dead: DeadLetter) -> bool:
        return (
            (not self.message_ids or dead.message_id in self.message_ids)
            and (self.replays is None or dead.replays == self.replays)
            and (self.queue is None or dead.queue == self.queue)
            and (self.actor is None or dead.actor == self.actor)
            and (self.exception is None or dead.exception == self.exception)
            and (self.since is None or (dead.failed_at is not None and dead.failed_at >= self.since))
        )


def dead_letter_queues(
    settings: Settings, broker: ProjectBroker, queue: str | None = None, *, reading: bool = False
) -> list[str]:
    """The queues of :func:`dead_letter_scope` (whether or not the scope is complete)."""
    return dead_letter_scope(settings, broker, queue, reading=reading)[0]


def dead_letter_scope(
    settings: Settings, broker: ProjectBroker, queue: str | None = None, *, reading: bool = False
) -> tuple[list[str], str]:
    """The dead-letter queues of the project's queues (:func:`~jobsystem.ops.scope.project_queues`)
    that RabbitMQ has, never every ``.DLQ`` with ``QUEUE_PREFIX`` (the default, empty, prefix
    would take every application's on the vhost), and why the index was not read (``""``: it was;
    :func:`~jobsystem.ops.scope.index_unread`). A ``queue`` named is the project's
    (:func:`~jobsystem.ops.scope.project_queue`: the prefix added unless it names one whole):
    another is refused with :class:`~jobsystem.ops.scope.ForeignQueue`, unless ``reading`` (list,
    show, export, re-index) and its ``.DLQ`` exists: named explicitly, a removed actor's letters
    the index does not know stay readable, and can be re-indexed (this environment's own dead
    letters only: :func:`reindex`)."""
    if queue is not None:
        return [_named(settings, broker, q_name(queue), reading)], ""
    scope = project_scope(broker)
    names = sorted(q + DEAD_LETTER_SUFFIX for q in scope.queues)
    try:
        missing = set(missing_queues(settings, names, RABBITMQ_TIMEOUT_S))
    except ConnectionError:
        return names, scope.unread  # the operation's own connection reports the unreachable broker
    return [name for name in names if name not in missing], scope.unread


def _named(settings: Settings, broker: ProjectBroker, queue: str, reading: bool) -> str:
    """The dead-letter queue of ``queue`` named by an operator (see :func:`dead_letter_scope`);
    for reading, the first of this environment's (prefix added) and the name as given whose
    ``.DLQ`` exists: a removed actor's queue named whole, or another environment's, is read, and
    only :func:`~jobsystem.ops.scope.changeable` letters are ever indexed or changed."""
    try:
        return project_queue(settings, broker, queue) + DEAD_LETTER_SUFFIX
    except ForeignQueue:
        if reading:
            names = list(dict.fromkeys(q + DEAD_LETTER_SUFFIX for q in (settings.queue(queue), queue)))
            with contextlib.suppress(ConnectionError):  # unreachable: refused, as not known
                missing = set(missing_queues(settings, names, RABBITMQ_TIMEOUT_S))
                found = [name for name in names if name not in missing]
                if found:
                    return found[0]
        raise


Progress = Callable[[int], None]


def _settle(
    broker: ProjectBroker,
    reader: Reader,
    dead_letter_queue: str,
    acked: list[DeadLetter],
    outcome: Outcome,
    *,
    replayed: bool = False,
) -> None:
    """Forget ``acked`` in the index once RabbitMQ confirmed their acks; if it cannot be had, keep
    them indexed (they may be back in their queue), say so and raise :class:`Stopped`."""
    if not acked:
        return
    if not reader.settle(dead_letter_queue):
        unconfirmed(outcome, acked, replayed=replayed, error_class=reader.failure or "AMQPError")
    forget(broker, acked)


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
    """Publish the matching dead letters back to their queues, then remove them. One whose queue
    is gone stays (publishing would declare the queue again, where no worker reads it), and so
    does one the send would refuse (:func:`_replay_of`). A failure that stops the replay ends
    it with an outcome saying so (:attr:`Outcome.stopped`), never an error."""
    outcome, ours = Outcome(), changeable(broker)
    gone: set[str] = set()
    with Reader(broker) as reader, contextlib.suppress(Stopped):
        exists = functools.cache(reader.queue_exists)
        for dead_letter_queue in queues:
            batch: list[tuple[Message[Any], int, DeadLetter]] = []
            with reading(outcome, "replayed"):  # what the batch read stays: no replay without an ack
                for dead, tag in reader.stream(dead_letter_queue):
                    progress(1)
                    if not filters.match(dead):
                        continue
                    outcome.matched_one(dead, by_id=bool(filters.message_ids))
                    if not ours(dead):
                        outcome.leave(dead)
                        continue
                    message = _replay_of(broker, dead, outcome)
                    if message is None:
                        continue
                    if not exists(message.queue_name):
                        gone.add(message.queue_name)
                        outcome.failed += 1
                        continue
                    batch.append((message, tag, dead))
                    if len(batch) >= batch_size:
                        _publish_then_ack(broker, reader, dead_letter_queue, batch, outcome)
                        batch = []
                _publish_then_ack(broker, reader, dead_letter_queue, batch, outcome)
    outcome.note_left()
    outcome.note_skipped()
    if gone:
        outcome.notes.append(
            f"not replayed, their queue is gone: {', '.join(sorted(gone))} (start a worker that declares it)"
        )
    return outcome


def _replay_of(broker: ProjectBroker, dead: DeadLetter, outcome: Outcome) -> Message[Any] | None:
    """The message to publish for ``dead``; None, counted skipped, for a body that is not a
    well-formed message, or whose idempotency key the send refuses: a refused key fails the
    whole batch it is sent in, so it is checked here, letter by letter, and only that letter
    stays (it needs its key, or its actor's key function, fixed)."""
    message = None if dead.reason in NOT_REPLAYABLE else dead.replay_message()
    if message is None:
        outcome.skip(MALFORMED)
    elif _key_refused(broker, message):
        outcome.skip(KEY_REFUSED)
        return None
    return message


def _key_refused(broker: ProjectBroker, message: Message[Any]) -> bool:
    """Whether the send's idempotency check would refuse the key of ``message`` (its actor's
    function raises, or it is "" or not a key): the check the send makes, on a copy. A message
    already registered (``idempotency_registered``) is not checked again at send."""
    if message.options.get(REGISTERED):
        return False
    for middleware in broker.middleware:
        if isinstance(middleware, Idempotency):
            try:
                middleware.key_of(broker, message.copy())
            except IdempotencyKeyError:
                return True
    return False


def _publish_then_ack(
    broker: ProjectBroker,
    reader: Reader,
    dead_letter_queue: str,
    batch: list[tuple[Message[Any], int, DeadLetter]],
    outcome: Outcome,
) -> None:
    """Publish ``batch``'s replays, ack the dead letters of those RabbitMQ confirmed, and forget
    them in the index once their acks are confirmed too."""
    if not batch:
        return
    try:
        send_bulk([m for m, _, _ in batch], broker=broker)
        confirmed = {m.message_id for m, _, _ in batch}
    except BulkSendError as error:
        confirmed = {m.message_id for m in error.confirmed}
        _not_replayed(outcome, error)
    except Exception as exc:  # raised before the first publish (send_bulk's contract): none went out
        not_sent(outcome, exc, len(batch))
    replayed = [(tag, dead) for message, tag, dead in batch if message.message_id in confirmed]
    outcome.done += len(replayed)
    try:
        for tag, _ in replayed:
            reader.ack(tag)
    except pika.exceptions.AMQPError as exc:  # the reader's connection was lost (idle through the publish)
        unconfirmed(outcome, [dead for _, dead in replayed], replayed=True, error_class=type(exc).__name__)
    _settle(broker, reader, dead_letter_queue, [dead for _, dead in replayed], outcome, replayed=True)


def _not_replayed(outcome: Outcome, error: BulkSendError) -> None:
    """Count and note the letters whose replay RabbitMQ did not confirm, naming the failure by its
    class: the error's text may name RabbitMQ's host and port, and notes reach the dashboard's
    answer and its audit log (the text is logged at DEBUG only)."""
    outcome.note_not_replayed(len(error.failed), error.error_class)
    log_failure(
        logger,
        logging.WARNING,
        "dead_letter_replay_unconfirmed",
        str(error),
        error=error.error_class,
        failed=len(error.failed),
    )


def forget(broker: ProjectBroker, removed: list[DeadLetter]) -> None:
    """Take dead letters removed from their queue out of the index; a store that does not answer
    leaves them listed (the dashboard shows the index and RabbitMQ disagree, a re-index fixes it)."""
    index = broker.dead_letter_index
    if index is None or not removed:
        return
    try:
        index.backend.remove([(dead.queue, dead.message_id) for dead in removed])
    except StoreUnavailable as exc:
        log_outage(logger, logging.WARNING, "dead_letter_index_stale", exc, removed=len(removed))


def purge(
    broker: ProjectBroker, queues: list[str], filters: Filters, *, progress: Progress = _noop
) -> Outcome:
    """Remove the matching dead letters for good (``done``: those whose acks RabbitMQ confirmed).
    A failure that stops it ends it with an outcome saying so (:attr:`Outcome.stopped`)."""
    outcome, ours = Outcome(), changeable(broker)
    with Reader(broker) as reader, contextlib.suppress(Stopped):
        for dead_letter_queue in queues:
            acked: list[DeadLetter] = []
            with reading(outcome, "purged", acked):
                for dead, tag in reader.stream(dead_letter_queue):
                    progress(1)
                    if not filters.match(dead):
                        continue
                    outcome.matched_one(dead, by_id=bool(filters.message_ids))
                    if ours(dead):
                        acked.append(dead)  # first: an ack that raises may have gone out
                        reader.ack(tag)
                    else:
                        outcome.leave(dead)
                    if len(acked) >= 500:
                        _settle(broker, reader, dead_letter_queue, acked, outcome)
                        outcome.done += len(acked)
                        acked.clear()
            _settle(broker, reader, dead_letter_queue, acked, outcome)
            outcome.done += len(acked)
    outcome.note_left()
    return outcome


@dataclass(frozen=True)
class Reindexed:
    """What a re-index found: letters indexed, and letters left out as not the project's."""

    indexed: int
    left_out: int


def reindex(broker: ProjectBroker, dead_letter_queue: str) -> Reindexed:
    """Rebuild the index of one dead-letter queue from the queue itself (a full read, nothing
    removed), with the letters the project may change (:func:`~jobsystem.ops.scope.changeable`):
    a queue no actor declares brings only the project's own dead letters into the index, never
    another application's. Dead letters that arrive during the read may be left out: run it
    again if the counts still disagree. One that cannot go on raises :class:`ReadStopped`, the
    index as it was (replaced whole or not at all)."""
    index = broker.dead_letter_index
    if index is None:
        return Reindexed(0, 0)
    queue = dead_letter_queue.removesuffix(DEAD_LETTER_SUFFIX)
    ours, entries, left_out = changeable(broker), list[DeadLetterEntry](), 0
    with Reader(broker) as reader, read_only("nothing re-indexed; re-index again"):
        for dead, _ in reader.stream(dead_letter_queue):
            if ours(dead):
                entries.append(dead.index_entry())
            else:
                left_out += 1
    with read_only(f"the index of {queue} is as it was; re-index again once the store answers"):
        index.backend.replace(queue, entries)
    return Reindexed(len(entries), left_out)


def read(broker: ProjectBroker, queues: list[str], filters: Filters) -> Iterator[DeadLetter]:
    """The matching dead letters, streamed; none is removed (:class:`ReadStopped` if it cannot go on)."""
    with Reader(broker) as reader, read_only("nothing removed; run the command again"):
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
