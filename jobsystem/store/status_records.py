"""What a job's status record is: its states and their order, a change to it, the record as read.

Every change is a :class:`StatusUpdate` carrying an ``order`` (attempt x 10 + phase rank). A record
only takes an update whose order is not lower than its own, so writes from different processes
(the sender's ``queued``, the worker's ``running``) may land in any order and the record still
never goes back: a late ``queued`` cannot hide a ``running`` job, and a duplicate delivery skipped
after the job succeeded cannot turn ``succeeded`` into ``skipped``. The backends that store the
records are in :mod:`jobsystem.store.status`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

__all__ = [
    "LOADED_FIELDS",
    "REPLAY_STRIDE",
    "STATE_RANKS",
    "JobStatus",
    "StatusUpdate",
    "encode_updates",
    "order_of",
]

#: The states a job goes through, and the rank of each within one attempt.
STATE_RANKS: dict[str, int] = {
    "queued": 0,
    # After queued: the worker's ``scheduled`` (a deferral) is never hidden by the sender's late
    # ``queued``; the job stays scheduled until it runs (a retry's takes the place of retrying).
    "scheduled": 1,
    "running": 1,
    "failed": 2,
    "retrying": 3,
    "skipped": 4,
    "succeeded": 5,
    "dead": 5,
    "cancelled": 5,
}


#: The fields the Redis script reads with each record: what the updates test, what a new attempt
#: deletes (no HDEL when absent), and the usual once-fields.
LOADED_FIELDS = (
    "ord",
    "state",
    "queue",
    "actor",
    "enqueued_at",
    "ix",
    "timeline",
    "progress",
    "note",
    "retry_at",
    "due_at",
)

#: Orders of one replay of a message come after every order of the one before (attempts <= 101).
REPLAY_STRIDE = 10_000


def order_of(attempt: int, state: str, replays: int = 0) -> int:
    """The order of ``state`` within attempt number ``attempt`` (0 before the first run) of the
    message's ``replays``-th replay from the dead letters (its attempts start again at 1)."""
    return replays * REPLAY_STRIDE + attempt * 10 + STATE_RANKS[state]


@dataclass(slots=True)
class StatusUpdate:
    """A change to one message's record.

    ``fields`` are set, ``once`` fields only when the record has none yet (actor, queue),
    ``delete`` fields removed (a new attempt clears the last one's progress). Treat it as
    immutable; it is not frozen because a frozen dataclass takes ~4x longer to build (two per job).
    """

    message_id: str
    queue: str
    order: int
    fields: Mapping[str, str]
    once: Mapping[str, str] = field(default_factory=dict)
    delete: tuple[str, ...] = ()

    @property
    def progress_only(self) -> bool:
        """True for a progress report: a newer one for the same message replaces it before it is written."""
        return "state" not in self.fields and not self.once and not self.delete


def encode_updates(updates: list[StatusUpdate]) -> bytes:
    """``updates`` as one flat JSON array of UTF-8, as the Redis script reads them
    (:data:`jobsystem.store.status_fold.APPLY_LUA`): per update, its message id, queue, order,
    the number of its fields then their names and their values, the same for its once-fields (``-1``:
    those of the message's update before in the batch, not sent again), the number of deleted
    fields then their names. Flat, because the script's JSON decoder builds a Lua table for each
    object or array it reads: one table per batch costs Redis less than four per update.
    orjson, ~10x faster than ``json.dumps``. A lone surrogate (``str(exception)`` of undecodable
    bytes) is not UTF-8, and Redis's cjson refuses its ``\\ud800`` escape: it becomes ``?``
    instead of failing the whole batch (which the writer would retry forever)."""
    flat: list[Any] = []
    once_before: dict[str, Mapping[str, str]] = {}
    for update in updates:
        fields, once, message_id = update.fields, update.once, update.message_id
        flat += (message_id, update.queue, update.order, len(fields))
        flat += fields  # the names, then the values: ~2x faster than pair by pair
        flat += fields.values()
        if once_before.get(message_id) == once:
            flat.append(-1)
        else:
            flat.append(len(once))
            flat += once
            flat += once.values()
            once_before[message_id] = once
        flat.append(len(update.delete))
        flat += update.delete
    try:
        return orjson.dumps(flat)
    except orjson.JSONEncodeError:
        return json.dumps(flat, ensure_ascii=False).encode(errors="replace")


@dataclass(frozen=True)
class JobStatus:
    """What is known of one job, as an application shows it (``GET /videos/<id>/status``).

    Times are milliseconds since the epoch (each writer's clock); ``progress`` is 0..1 as the actor
    last reported it; ``error`` is the last failure's scrubbed message; ``result`` the actor's
    return value when it was small and JSON.
    """

    message_id: str
    state: str
    actor: str | None = None
    queue: str | None = None
    attempts: int = 0
    enqueued_at: int | None = None
    started_at: int | None = None
    finished_at: int | None = None
    updated_at: int | None = None
    retry_at: int | None = None
    due_at: int | None = None
    progress: float | None = None
    note: str | None = None
    error_type: str | None = None
    error: str | None = None
    traceback: str | None = None
    result: Any = None
    timeline: list[list[Any]] = field(default_factory=list)
    args: Any = None

    @property
    def finished(self) -> bool:
        """Whether the job reached a final state (succeeded, dead, skipped or cancelled)."""
        return self.state in ("succeeded", "dead", "skipped", "cancelled")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_fields(cls, message_id: str, fields: Mapping[str, str]) -> JobStatus:
        def number(name: str) -> int | None:
            value = fields.get(name)
            return int(value) if value else None

        progress = fields.get("progress")
        result = fields.get("result")
        timeline = fields.get("timeline")
        args = fields.get("args")
        return cls(
            message_id=message_id,
            state=fields.get("state", "queued"),
            actor=fields.get("actor") or None,
            queue=fields.get("queue") or None,
            attempts=int(fields.get("attempts") or 0),
            enqueued_at=number("enqueued_at"),
            started_at=number("started_at"),
            finished_at=number("finished_at"),
            updated_at=number("updated_at"),
            retry_at=number("retry_at"),
            due_at=number("due_at"),
            progress=float(progress) if progress else None,
            note=fields.get("note") or None,
            error_type=fields.get("error_type") or None,
            error=fields.get("error") or None,
            traceback=fields.get("traceback") or None,
            result=json.loads(result) if result else None,
            timeline=json.loads(timeline) if timeline else [],
            args=_json_or_text(args) if args else None,
        )


def _json_or_text(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw
