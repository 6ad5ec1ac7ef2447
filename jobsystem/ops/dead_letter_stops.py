"""What stops an operation on the dead letters before its end, and what its outcome then says.

An operation that cannot go on (the reader's connection lost between two letters or at an ack,
acks RabbitMQ did not confirm) raises :class:`Stopped` once its
:class:`~jobsystem.ops.dead_letter_outcome.Outcome` says what happened and what was left; the
operation catches it and returns that outcome, so ``jobctl`` and the dashboard end with a
summary of what was done, never a traceback. A failure is named by its class: an error's text
may name RabbitMQ's or the store's host and port, and notes reach ``jobctl``'s output, the
dashboard's answer and its audit log (the text is logged at DEBUG, see
:mod:`jobsystem.privacy.outage_lines`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import NoReturn

import pika.exceptions

from jobsystem.ops.dead_letter_outcome import Outcome
from jobsystem.ops.dead_letter_reader import DeadLetter
from jobsystem.privacy.outage_lines import log_outage

__all__ = ["Stopped", "reading", "unconfirmed"]

logger = logging.getLogger(__name__)


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
        outcome.note_stopped(
            type(exc).__name__,
            "reading the dead letters failed, RabbitMQ closed or lost the connection",
            f"the letters not yet {done} stay dead letters; run the command again",
        )
        raise Stopped from exc


def unconfirmed(outcome: Outcome, letters: list[DeadLetter], *, replayed: bool) -> NoReturn:
    """Count ``letters`` as not known to be removed, say what to do, and stop the operation."""
    if replayed:
        outcome.note_unremoved(letters)
    else:
        outcome.note_unconfirmed(letters)
    raise Stopped
