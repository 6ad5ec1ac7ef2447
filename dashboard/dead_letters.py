"""Dead letters: listed from the dead-letter index, retried and purged through ``jobctl dlq``'s code.

A page reads 50 entries of the index in the state store (:mod:`jobsystem.store.dead_letter_index`),
never the queues: RabbitMQ cannot seek, so the 10,000th dead letter is only reached by taking
the 9,999 before it. Each queue's count in the index is shown beside RabbitMQ's own; when they
differ (dead letters from before the index, moved by ``migrate-queues``, expired, purged outside
the project's tools) the page says so and an admin can re-index that queue.

Retry and purge act on RabbitMQ with :mod:`jobsystem.ops.dead_letters`, exactly as
``jobctl dlq retry|purge`` do: a replay is published with confirms and only then acked, so
nothing is lost if the dashboard dies midway; ids are matched while the queue is read, so an
action costs one read of the queue (seconds for 10,000), never a page view. Actions run one at a
time per dashboard process.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dashboard.project import (
    DEAD_LETTER_SUFFIX,
    Cursor,
    DeadLetterEntry,
    DeadLetterFilter,
    ForeignQueue,
    HealthReport,
    Project,
    actor_label,
    dead_letter_counts,
    dead_letter_ops,
    dead_letter_queue,
    missing_queues,
)

__all__ = [
    "NO_EXCEPTION",
    "ActionError",
    "Selection",
    "dead_letter_list",
    "exception_filter",
    "parse_since",
    "purge",
    "reindex",
    "retry",
    "shown_entry",
]

PAGE, MAX_PAGE = 50, 200
#: The longest a page waits for RabbitMQ's dead-letter counts.
RABBITMQ_TIMEOUT_S = 2.0
#: The most ids one request may name.
MAX_IDS = 10_000
#: The exception filter's name for the dead letters without an exception (rejected, aged out; the
#: index holds ""): an empty filter means "any exception", and no exception class has this name.
NO_EXCEPTION = "(none)"
_ACTING = threading.Lock()


class ActionError(ValueError):
    """A request that cannot be carried out as asked (answered 400 with the message)."""


def parse_since(value: str | None) -> datetime | None:
    """An ISO date or time (UTC unless it says otherwise)."""
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ActionError("since: use an ISO date or time, e.g. 2026-11-29 or 2026-11-29T08:00") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def exception_filter(value: str | None) -> str | None:
    """The index's and the operations' value for the exception filter as the page names it."""
    return "" if value == NO_EXCEPTION else value


def _millis(moment: datetime | None) -> int | None:
    return int(moment.timestamp() * 1000) if moment else None


def shown_entry(entry: DeadLetterEntry) -> dict[str, Any]:
    """An entry as the page shows it: an actor that cannot be an actor's name (indexed before the
    records checked it: the sender's text) as the placeholder, until a re-index rewrites it."""
    return {**entry.to_dict(), "actor": actor_label(entry.actor)}


def _facets(facets: dict[str, list[str]]) -> dict[str, list[str]]:
    return {**facets, "actor": sorted({actor_label(a) for a in facets.get("actor", [])})}


def dead_letter_list(
    project: Project,
    report: HealthReport | None,
    *,
    queue: str | None = None,
    actor: str | None = None,
    exception: str | None = None,
    since: str | None = None,
    before: str | None = None,
    limit: int = PAGE,
) -> dict[str, Any]:
    """The dead letters page's data (``/dead-letters`` and ``/api/dead-letters``)."""
    index = project.dead_letter_index
    if index is None:
        raise ActionError("no state store: dead letters are not indexed")
    limit = max(1, min(limit, MAX_PAGE))
    # Named as the actions name it (``emails``: this environment's): the page lists what they act on.
    if queue:
        (named,) = _dead_letter_queues(project, queue)
        queue = named.removesuffix(DEAD_LETTER_SUFFIX)
    dl_filter = DeadLetterFilter(queue, actor, exception_filter(exception), _millis(parse_since(since)))
    page = index.page(dl_filter, Cursor.decode(before), limit)
    indexed = index.counts()
    names = set(indexed) | ({h.queue for h in report.queues} if report else set())
    in_rabbitmq = rabbitmq_counts(project, sorted(names))
    counts = [
        {
            "queue": name,
            "dead_letter_queue": dead_letter_queue(name),
            "indexed": indexed.get(name, 0),
            "in_rabbitmq": in_rabbitmq.get(name),
            "in_step": in_rabbitmq.get(name) in (None, indexed.get(name, 0)),
        }
        for name in sorted(set(indexed) | {q for q, n in in_rabbitmq.items() if n})
    ]
    facets = _facets(index.facets())
    facets["exception"] = [e or NO_EXCEPTION for e in facets["exception"]]
    return {
        "dead_letters": [shown_entry(entry) for entry in page.entries],
        "next": page.next.encode() if page.next else None,
        "queues": counts,
        "facets": facets,
        "queue": queue,
        "actor": actor,
        "exception": exception,
        "since": since,
    }


def rabbitmq_counts(project: Project, queues: list[str]) -> dict[str, int | None]:
    """Dead letters per queue now, from passive declares on one connection (None: no such queue
    or RabbitMQ unreachable), within :data:`RABBITMQ_TIMEOUT_S` in all: the page refreshes every
    few seconds, and a RabbitMQ that accepts connections but never answers must not hold a
    request thread per refresh. Read per page rather than sampled: a count a few seconds old
    would flag every fresh dead letter as missing from RabbitMQ."""
    try:
        return dead_letter_counts(project.settings, queues, RABBITMQ_TIMEOUT_S)
    except ConnectionError:
        return dict.fromkeys(queues)


@dataclass(frozen=True)
class Selection:
    """What an action applies to: ids of one queue, or every dead letter matching the filters."""

    queue: str | None
    ids: tuple[str, ...] = ()
    all: bool = False
    actor: str | None = None
    exception: str | None = None
    since: str | None = None
    #: Only letters that record this many replays: those a stopped retry answered as
    #: ``unremoved_replays``, not a newer dead letter of the same id.
    replays: int | None = None

    @classmethod
    def from_json(cls, body: Any) -> Selection:
        """A selection from a request body, checked (:class:`ActionError` says what is wrong)."""
        if not isinstance(body, dict):
            raise ActionError("the body must be a JSON object")
        texts = {k: body.get(k) for k in ("queue", "actor", "exception", "since")}
        if any(v is not None and not isinstance(v, str) for v in texts.values()):
            raise ActionError("queue, actor, exception and since must be strings")
        ids, everything = body.get("ids") or [], body.get("all") is True
        if not isinstance(ids, list) or not all(isinstance(i, str) and i for i in ids):
            raise ActionError("ids must be a list of message ids")
        if bool(ids) == everything:
            raise ActionError('give "ids" (with "queue"), or "all": true (with optional filters)')
        if ids and not texts["queue"]:
            raise ActionError('"ids" need the "queue" they are dead letters of')
        if len(ids) > MAX_IDS:
            raise ActionError(f"at most {MAX_IDS} ids per request")
        parse_since(texts["since"])
        replays = body.get("replays")
        if replays is not None and (not isinstance(replays, int) or isinstance(replays, bool) or replays < 0):
            raise ActionError("replays must be a count (0 or more)")
        texts = {k: v or None for k, v in texts.items()}
        return cls(ids=tuple(ids), all=everything, replays=replays, **texts)

    def filters(self) -> dead_letter_ops.Filters:
        """What the operations match: the ids, or the filters (``(none)``: no exception)."""
        return dead_letter_ops.Filters(
            message_ids=frozenset(self.ids),
            actor=self.actor,
            exception=exception_filter(self.exception),
            since=parse_since(self.since),
            replays=self.replays,
        )

    def describe(self) -> dict[str, Any]:
        """The selection as the audit log keeps it (the first 100 ids; how many there were)."""
        data: dict[str, Any] = {"queue": self.queue}
        if self.all:
            data.update(all=True, actor=self.actor, exception=self.exception, since=self.since)
        else:
            data.update(ids=list(self.ids[:100]), id_count=len(self.ids))
        if self.replays is not None:
            data["replays"] = self.replays
        return data


def _dead_letter_queues(project: Project, queue: str | None, *, reading: bool = False) -> list[str]:
    """The project's dead-letter queues (of ``queue`` only, when given), as ``jobctl dlq`` takes
    them: another application's queue on the vhost is neither shown nor acted on; ``reading``
    (a re-index) takes a queue named whose ``.DLQ`` exists too, as ``jobctl dlq list`` does."""
    try:
        return dead_letter_ops.dead_letter_queues(project.settings, project.broker, queue, reading=reading)
    except ForeignQueue as exc:
        raise ActionError(str(exc)) from None


def _target(project: Project, selection: Selection) -> tuple[list[str], Any]:
    """The dead-letter queues and the filters of ``selection``, the queue checked to exist."""
    queues = _dead_letter_queues(project, selection.queue)
    if selection.queue is not None and missing_queues(project.settings, queues):
        raise ActionError(f"RabbitMQ has no dead-letter queue for {selection.queue!r}")
    return queues, selection.filters()


def retry(project: Project, selection: Selection) -> dict[str, Any]:
    """Replay the selected dead letters (``jobctl dlq retry``'s loss-free replay)."""
    queues, filters = _target(project, selection)
    with _ACTING:
        outcome = dead_letter_ops.replay(project.broker, queues, filters)
    return {
        "retried": outcome.done,
        "matched": outcome.matched,
        "failed": outcome.failed,
        "skipped": outcome.skipped,
        "unconfirmed": outcome.unconfirmed,
        # Replayed, their letters maybe not removed: to purge, not to retry (at most one batch).
        "unremoved": outcome.unremoved,
        # Those ids by the replays their letters record: purged with "replays", a newer dead letter
        # of the same job (its replay failed again) is left.
        "unremoved_replays": {str(n): ids for n, ids in outcome.unremoved_replays.items()},
        "left": sum(outcome.left.values()),
        # The class of the error that stopped it before the end (None: it went through them all).
        "stopped": outcome.stopped,
        "notes": outcome.notes,
    }


def purge(project: Project, selection: Selection) -> dict[str, Any]:
    """Delete the selected dead letters for good (``jobctl dlq purge``)."""
    queues, filters = _target(project, selection)
    with _ACTING:
        outcome = dead_letter_ops.purge(project.broker, queues, filters)
    return {
        "purged": outcome.done,
        "matched": outcome.matched,
        "unconfirmed": outcome.unconfirmed,
        "left": sum(outcome.left.values()),
        # The class of the error that stopped it before the end (None: it went through them all).
        "stopped": outcome.stopped,
        "notes": outcome.notes,
    }


def reindex(project: Project, queue: str) -> dict[str, Any]:
    """Rebuild one queue's index from the queue (a full read; nothing removed): the documented
    recovery, so a removed actor's queue the index lost is taken when named (its letters are
    then indexed, and can be retried or purged). Of a queue no actor declares, only the
    project's own dead letters are indexed; ``left_out`` counts the others (another
    application's), which retry and purge never take."""
    (name,) = _dead_letter_queues(project, queue, reading=True)
    if missing_queues(project.settings, [name]):
        raise ActionError(f"RabbitMQ has no dead-letter queue for {queue!r}")
    with _ACTING:
        done = dead_letter_ops.reindex(project.broker, name)
    return {"indexed": done.indexed, "left_out": done.left_out}
