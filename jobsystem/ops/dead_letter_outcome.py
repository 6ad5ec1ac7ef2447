"""What an operation on the dead letters did, and the notes its summary gives the operator.

The notes reach ``jobctl``'s output, the dashboard's answer and its audit log: they name a
failure by its class, never by an error's text (which may name RabbitMQ's host and port; see
:mod:`jobsystem.privacy.outage_lines`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jobsystem.ops.dead_letter_reader import DeadLetter
from jobsystem.rabbitmq.broker import DEAD_LETTER_SUFFIX

__all__ = ["KEY_REFUSED", "MALFORMED", "Outcome", "stop_note"]

#: How many message ids a note names (an operation may leave thousands: ``unremoved`` has all).
SHOWN_IDS = 10

#: Why a replay skips a letter (:meth:`Outcome.skip`): its body is not a well-formed message, or
#: the send's idempotency check refuses its key. Either way it stays a dead letter.
MALFORMED, KEY_REFUSED = "malformed", "key_refused"
_SKIP_NOTES = {
    MALFORMED: "{} malformed, not replayed (fix the sender; export or purge them)",
    KEY_REFUSED: "{} not replayed, their idempotency key is refused (empty, not a string or number,"
    " or their actor's idempotency_key function raised): they stay dead letters (fix the function"
    " or the sender; export or purge them)",
}


def stop_note(error_class: str, why: str, left: str, cause: str | None = None) -> str:
    """The note of an operation stopped for ``why`` (an error of class ``error_class``, wrapping one
    of class ``cause``), saying what it ``left``."""
    named = error_class if cause is None else f"{error_class}: {cause}"
    return f"stopped: {why} ({named}): {left}"


def _shown(ids: list[str]) -> str:
    """The first :data:`SHOWN_IDS` of ``ids``, and how many more."""
    more = len(ids) - SHOWN_IDS
    return " ".join(ids[:SHOWN_IDS]) + (f" and {more} more" if more > 0 else "")


@dataclass
class Outcome:
    """What an operation did, for its summary line."""

    matched: int = 0
    done: int = 0
    skipped: int = 0
    failed: int = 0
    #: Acked, but the connection was lost before RabbitMQ confirmed it: maybe back in the queue.
    unconfirmed: int = 0
    #: Of a replay, the message ids among ``unconfirmed``: replayed, their dead letters maybe not
    #: removed (to purge, not to retry again).
    unremoved: list[str] = field(default_factory=list)
    #: ``unremoved`` by the replays their letters record (:attr:`DeadLetter.replays`): what tells
    #: them from a newer dead letter of the same job, whose replay failed again.
    unremoved_replays: dict[int, list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: The class of the error that stopped the operation before every matching letter was read
    #: (None: it went through them all); a note says what it left.
    stopped: str | None = None
    #: Of ``skipped``, how many per reason (:data:`MALFORMED`, :data:`KEY_REFUSED`).
    skips: dict[str, int] = field(default_factory=dict)
    #: The message ids matched, when the filters name ids (so a caller can name those not found).
    found: set[str] = field(default_factory=set)
    #: Matched but not the project's to change (:func:`~jobsystem.ops.scope.changeable`), per
    #: dead-letter queue: left where they are.
    left: dict[str, int] = field(default_factory=dict)

    def matched_one(self, dead: DeadLetter, *, by_id: bool) -> None:
        """Count a matching letter; ``by_id``: the filters name message ids."""
        self.matched += 1
        if by_id:
            self.found.add(dead.message_id)

    def leave(self, dead: DeadLetter) -> None:
        """Count a matching letter that is not the project's to change."""
        self.left[dead.dead_letter_queue] = self.left.get(dead.dead_letter_queue, 0) + 1

    def note_left(self) -> None:
        """Say which queues' letters were left, and why (one note per queue)."""
        for name, count in sorted(self.left.items()):
            queue = name.removesuffix(DEAD_LETTER_SUFFIX)
            self.notes.append(
                f"{count} left in {name}: not this environment's to change: stamped by another"
                f" environment (QUEUE_PREFIX), or unstamped where no actor declares {queue!r} (another"
                " application's, or a removed actor's from before the stamp; if its actors are yours,"
                " name their module)"
            )

    def skip(self, reason: str) -> None:
        """Count a letter not replayed for ``reason``; it stays where it is."""
        self.skipped += 1
        self.skips[reason] = self.skips.get(reason, 0) + 1

    def note_skipped(self) -> None:
        """Say how many letters were skipped, and why (one note per reason)."""
        for reason, count in self.skips.items():
            self.notes.append(_SKIP_NOTES[reason].format(count))

    def note_stopped(self, error_class: str, why: str, left: str, cause: str | None = None) -> None:
        """Stop the operation for ``why`` (an error of class ``error_class``, wrapping one of class
        ``cause``), saying what it left."""
        self.stopped = error_class
        self.notes.append(stop_note(error_class, why, left, cause))

    def note_unconfirmed(self, letters: list[DeadLetter]) -> None:
        """Count ``letters`` acked (purged) but not confirmed removed: running again is safe."""
        self.unconfirmed += len(letters)
        self.notes.append(
            f"{len(letters)} acked but not confirmed by RabbitMQ before the connection was lost: they may"
            " still be dead letters, and stay listed; run the command again"
        )

    def note_unremoved(self, letters: list[DeadLetter]) -> None:
        """Count ``letters`` replayed but not confirmed removed. Retrying them again is not safe:
        the replay keeps the message id, so the project cannot tell a second replay from the
        first, and only a job with an idempotency key is skipped (its key completed). Nor is a
        purge by id alone: a replay that failed again is a newer dead letter of the same id, so
        the purge named also matches the replays each letter records."""
        ids = [dead.message_id for dead in letters]
        self.unconfirmed += len(ids)
        self.unremoved += ids
        for dead in letters:
            self.unremoved_replays.setdefault(dead.replays or 0, []).append(dead.message_id)
        self.notes.append(
            f"{len(ids)} replayed, but the connection to RabbitMQ was lost before their removal from"
            " the dead letters was confirmed: they may still be dead letters, and stay listed. Do"
            " not retry them again (a retry publishes the same message id again, and runs a job"
            " without an idempotency key a second time): purge them, and not a newer dead letter of"
            " the same job (its replay failed again), with "
            + " and ".join(
                f"jobctl dlq purge --yes --replays {replays} ID...: {_shown(group)}"
                for replays, group in sorted(self.unremoved_replays.items())
            )
        )

    def purges(self) -> list[str]:
        """The commands that purge the letters of ``unremoved``, and no newer one of their ids."""
        return [
            f"jobctl dlq purge --yes --replays {replays} {' '.join(group)}"
            for replays, group in sorted(self.unremoved_replays.items())
        ]

    def note_not_replayed(self, count: int, error_class: str) -> None:
        """Count ``count`` letters whose replay RabbitMQ did not confirm, by the failure's class."""
        self.failed += count
        self.notes.append(
            f"{count} not replayed, RabbitMQ did not confirm their publish ({error_class}): they stay"
            " dead letters (one whose publish was lost with its connection may have been queued all"
            " the same)"
        )
