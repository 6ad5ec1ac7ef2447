"""What stops an operation on the dead letters before its end, and what its outcome then says.

An operation that cannot go on (the reader's connection lost between two letters or at an ack,
acks RabbitMQ did not confirm, the state store down when a replay's idempotency keys are
checked) raises :class:`Stopped` once its :class:`~jobsystem.ops.dead_letter_outcome.Outcome`
says what happened and what was left; the operation catches it and returns that outcome, so
``jobctl`` and the dashboard end with a summary of what was done, never a traceback. A failure
is named by its class: an error's text may name RabbitMQ's or the store's host and port, and
notes reach ``jobctl``'s output, the dashboard's answer and its audit log (the text is logged at
DEBUG, see :mod:`jobsystem.privacy.outage_lines`).

A read that removes nothing (list, show, export, re-index) has no outcome to end with: one that
cannot go on raises :class:`ReadStopped`, whose note says the same by class, for ``jobctl`` to
end with and the dashboard to answer (503). The letters it read were never acked: they go back
to their queue when its connection closes, or when RabbitMQ finds it lost.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import NoReturn

import pika.exceptions

from jobsystem.ops.dead_letter_outcome import Outcome, stop_note
from jobsystem.ops.dead_letter_reader import DeadLetter
from jobsystem.ops.outages import cause, store_failed
from jobsystem.privacy.outage_lines import log_outage
from jobsystem.store.base import StoreUnavailable

__all__ = ["ReadStopped", "Stopped", "not_sent", "read_only", "reading", "unconfirmed"]

logger = logging.getLogger(__name__)

#: Why an operation stopped when its reader failed.
READ_FAILED = "reading the dead letters failed, RabbitMQ closed or lost the connection"


class Stopped(Exception):
    """The operation cannot go on (its outcome says why): it ends with what it did so far."""


@contextlib.contextmanager
def reading(outcome: Outcome, done: str, unsure: list[DeadLetter] | None = None) -> Iterator[None]:
    """Stop the operation, saying so, when the reader fails (its connection or channel closed or
    lost, between two letters or at an ack): the letters not yet ``done`` stay dead letters, and
    those acked but not settled (``unsure``) may be back in their queue."""
    try:
        yield
    except pika.exceptions.AMQPError as exc:
        log_outage(logger, logging.WARNING, "dead_letter_read_failed", exc, done=outcome.done)
        if unsure:
            outcome.note_unconfirmed(list(unsure))
        left = f"the letters not yet {done} stay dead letters; run the command again"
        outcome.note_stopped(type(exc).__name__, READ_FAILED, left)
        raise Stopped from exc


class ReadStopped(Exception):
    """A read that removes nothing stopped before its end: ``note`` says why (the error named by
    its class, ``error_class``) and what it left."""

    def __init__(self, error_class: str, note: str) -> None:
        super().__init__(note)
        self.error_class = error_class
        self.note = note


@contextlib.contextmanager
def read_only(left: str) -> Iterator[None]:
    """Raise :class:`ReadStopped`, saying it ``left`` what it says, when the reader fails (its
    connection or channel closed or lost) or the state store does not answer."""
    try:
        yield
    except pika.exceptions.AMQPError as exc:
        log_outage(logger, logging.WARNING, "dead_letter_read_failed", exc)
        raise ReadStopped(type(exc).__name__, stop_note(type(exc).__name__, READ_FAILED, left)) from exc
    except StoreUnavailable as exc:
        log_outage(logger, logging.WARNING, "dead_letter_read_failed", exc)
        why = store_failed(exc)
        raise ReadStopped(type(exc).__name__, stop_note(type(exc).__name__, why, left, cause(exc))) from exc


def unconfirmed(outcome: Outcome, letters: list[DeadLetter], *, replayed: bool, error_class: str) -> NoReturn:
    """Count ``letters`` as not known to be removed, say what to do, and stop the operation
    (stopped by an error of class ``error_class``: callers that audit it read ``outcome.stopped``)."""
    outcome.stopped = outcome.stopped or error_class
    if replayed:
        outcome.note_unremoved(letters)
    else:
        outcome.note_unconfirmed(letters)
    raise Stopped


def not_sent(outcome: Outcome, exc: Exception, count: int) -> NoReturn:
    """Stop the replay: the send of a batch of ``count`` failed before it published any (a send
    hook refused it, the state store not answering the idempotency check; the declare of a queue
    failed). The letters read stay dead letters: they were not acked."""
    left = f"{count} read and not replayed (none published) and those not yet read stay dead letters"
    store = next((error for error in _chain(exc) if isinstance(error, StoreUnavailable)), None)
    if store is None:
        log_outage(logger, logging.ERROR, "dead_letter_replay_stopped", exc, letters=count)
        why = "the replays could not be published"
        outcome.note_stopped(type(exc).__name__, why, f"{left}; run the command again once that is fixed")
        raise Stopped from exc
    log_outage(
        logger, logging.WARNING, "dead_letter_replay_stopped", store, letters=count, send=type(exc).__name__
    )
    outcome.note_stopped(
        type(exc).__name__,
        store_failed(store, "the replays' idempotency check"),
        f"{left}; run the command again once the store answers",
        cause(store),
    )
    raise Stopped from exc


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the errors it was raised from (``__cause__``, else ``__context__``)."""
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__
