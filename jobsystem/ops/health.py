"""Queue health: numbers per queue from RabbitMQ and the state store, and a verdict against thresholds.

Used by ``jobctl health`` (exit 0 healthy, 1 degraded, 2 broker unreachable), by the
``check_health`` actor, by the dashboard and by the metrics endpoint's queue gauges. Waiting,
consumers, delayed messages not yet taken and dead letters come from AMQP passive declares
(:mod:`jobsystem.ops.queue_counts`: exact, current); unacked, delayed messages held by workers and
rates from the management API (:mod:`jobsystem.ops.management`: samples refreshed every 5 s); the
oldest waiting message's age by peeking at the head message; succeeded and failed totals from the
job-status counters; jobs waiting in RabbitMQ's delay cascade (scheduled, and the next one's due
time) from the state store's scheduled index, since the cascade's queues are shared by every queue.

RabbitMQ, its management API and the state store are asked at once (:mod:`jobsystem.ops.deadline`)
and the whole check waits ``timeout`` seconds at most (5 s by default, under a Prometheus scrape's
10 s): a dependency that has not answered by then is reported as not answering, with the rest of
the report. When the management API does not answer, the verdict rests on the AMQP counts, and
the age is not judged. A state store that does not answer is a problem of the whole system.

What the report says of a dependency that did not answer is a fixed text with the error's class
name at most (:mod:`jobsystem.ops.outages`): the report leaves the process (``jobctl`` output,
alerts, the dashboard), and the errors' own texts name hosts and ports. Those are kept apart,
in ``causes``, for the callers' logs only.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import requests

from jobsystem.observability.logs import get_logger
from jobsystem.ops.deadline import Call, Deadline, Lane, Late
from jobsystem.ops.management import Undated, oldest_age_s, queue_stats, rate
from jobsystem.ops.outages import store_outage, unreachable
from jobsystem.ops.queue_counts import AmqpCounts, count_queues
from jobsystem.settings import Settings
from jobsystem.store.base import StateStore, StoreUnavailable
from jobsystem.store.scheduled import Scheduled
from jobsystem.store.status import status_backend

__all__ = [
    "HealthReport",
    "Problem",
    "QueueHealth",
    "check",
    "measure",
    "queue_depths",
]


logger = get_logger(__name__)

#: Each state store is asked on one thread of its own (an SQLite store opens a connection per
#: thread), which a call hanging on another store does not hold up.
_STATE_LANES: weakref.WeakKeyDictionary[StateStore, Lane] = weakref.WeakKeyDictionary()
_STATE_LANES_LOCK = threading.Lock()


def _release_thread(store: weakref.ref[StateStore]) -> None:
    """The lane thread's connection given back as the thread ends (the store held weakly: the
    lane, a value of ``_STATE_LANES``, must not keep its key alive)."""
    state = store()
    if state is not None:
        state.release_thread()


def _lane(state: StateStore) -> Lane:
    with _STATE_LANES_LOCK:
        lane = _STATE_LANES.get(state)
        if lane is None:
            lane = Lane("health-state", on_exit=functools.partial(_release_thread, weakref.ref(state)))
            _STATE_LANES[state] = lane
        return lane


@dataclass(frozen=True)
class Problem:
    """One degraded condition: of a queue, ``kind`` backlog, dead_letters, oldest_age or
    no_consumers (jobs that will not run: waiting, delayed or scheduled and due soon, and nobody
    to take them); of the system, ``state_store`` or ``unroutable_delays``."""

    kind: str
    detail: str


@dataclass
class QueueHealth:
    """The numbers of one queue (None: not measurable from the source at hand), its problems, and
    the kinds of problem this check could not judge (``unjudged``: an unmeasured age).
    ``scheduled_soon``: of the scheduled, those due within ``DELAY_HORIZON_MS`` of now, either
    side (see :func:`_never_run`)."""

    queue: str
    waiting: int | None = None
    in_progress: int | None = None
    delayed: int | None = None
    scheduled: int | None = None
    scheduled_soon: int | None = None
    next_due_at: int | None = None
    dead: int | None = None
    consumers: int | None = None
    delay_consumers: int | None = None
    publish_rate: float | None = None
    ack_rate: float | None = None
    oldest_age_s: float | None = None
    succeeded: int | None = None
    failed: int | None = None
    problems: list[Problem] = field(default_factory=list)
    unjudged: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> Literal["healthy", "degraded"]:
        return "degraded" if self.problems else "healthy"


@dataclass
class HealthReport:
    """The verdict over all queues checked, the system's own ``problems`` (the state store down)
    and the kinds of them it could not judge (``unjudged``), and what could not be measured in
    ``notes``. ``causes``: the own texts of the errors of what did not answer, by ``unreachable``
    (RabbitMQ), ``management`` or ``state_store``: for a log, never in :meth:`to_dict`."""

    status: Literal["healthy", "degraded", "unreachable"]
    queues: list[QueueHealth]
    source: Literal["management", "amqp"] | None = None
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    problems: list[Problem] = field(default_factory=list)
    unjudged: list[str] = field(default_factory=list)
    causes: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def exit_code(self) -> int:
        return {"healthy": 0, "degraded": 1, "unreachable": 2}[self.status]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        del data["causes"]
        for queue, health in zip(data["queues"], self.queues, strict=True):
            queue["verdict"] = health.verdict
        return data


@dataclass
class _Measured:
    """What RabbitMQ said: each queue's numbers, their source, what could not be measured, the
    messages waiting in ``unroutable`` (this environment's ``delay.unroutable``), and the text of
    the management API's error when it did not answer (for a log)."""

    queues: list[QueueHealth]
    source: Literal["management", "amqp"]
    notes: list[str]
    unroutable: str
    stranded: int
    cause: str | None = None


def _counted(counts: AmqpCounts) -> list[QueueHealth]:
    return [
        QueueHealth(
            queue,
            waiting=c.waiting,
            consumers=c.consumers,
            delayed=c.delayed,
            delay_consumers=c.delay_consumers,
            dead=c.dead,
        )
        for queue, c in counts.queues.items()
    ]


#: The queue type whose head a peek puts back untouched but for its ``redelivered`` flag. A peek
#: (a get, then a requeue) counts as a delivery of a quorum queue's head: past its
#: ``x-delivery-limit`` (RabbitMQ 4.0 sets 20 by default) the message is dead-lettered or dropped
#: (seen on RabbitMQ 3.10: ``tests/integration/test_health.py``).
PEEKABLE_TYPE = "classic"


def _peek_age(
    config: Settings, health: QueueHealth, timeout: float, deadline: Deadline, notes: list[str], kind: str
) -> None:
    """Fill in ``health``'s oldest age, or note why it could not be measured (then not judged).
    A queue of another ``kind`` than :data:`PEEKABLE_TYPE` is not peeked: the project declares
    classic queues only, and ``jobctl health --queue`` must not wear down another's messages."""
    if kind != PEEKABLE_TYPE:
        notes.append(f"{health.queue}: a {kind} queue, not peeked (each peek would count as a delivery)")
        health.unjudged.append("oldest_age")
        return
    try:
        if not deadline.remaining():
            raise Late("no time left")
        health.oldest_age_s = oldest_age_s(config, health.queue, deadline.within(timeout))
        return
    except (requests.RequestException, Late):
        notes.append(f"{health.queue}: could not peek at the oldest message")
    except Undated:
        notes.append(f"{health.queue}: the oldest message carries no time health can read")
    health.unjudged.append("oldest_age")


def _measure(
    config: Settings, queues: list[str], timeout: float, deadline: Deadline, peek: bool
) -> _Measured:
    """AMQP counts and the management API's samples, asked at once; then the peeks at the heads
    of the queues with messages waiting, while ``deadline`` lasts. Raises ConnectionError when
    RabbitMQ cannot be reached over AMQP before ``deadline``."""
    amqp = Call("amqp", lambda: count_queues(config, queues, timeout, deadline), deadline)
    stats = Call("management", lambda: queue_stats(config, deadline.within(timeout)), deadline)
    try:
        counts = amqp.result()
    except Late as exc:
        raise ConnectionError(str(exc)) from exc
    measured, notes = _counted(counts), []
    try:
        found = stats.result()
    except (requests.RequestException, Late) as exc:
        notes.append(f"{unreachable('management API', exc)}: no unacked, rates or age")
        for health in measured:
            health.unjudged.append("oldest_age")
        return _Measured(measured, "amqp", notes, counts.unroutable, counts.stranded, str(exc))
    for health in measured:
        main, delayed = found.get(health.queue, {}), found.get(health.queue + ".DQ", {})
        health.in_progress = int(main.get("messages_unacknowledged", 0))
        health.delayed = (health.delayed or 0) + int(delayed.get("messages_unacknowledged", 0))
        health.publish_rate, health.ack_rate = rate(main, "publish"), rate(main, "ack")
        if not peek:
            health.unjudged.append("oldest_age")
        elif health.waiting:  # every queue was classic before RabbitMQ 3.8 said a type
            _peek_age(config, health, timeout, deadline, notes, str(main.get("type", PEEKABLE_TYPE)))
    return _Measured(measured, "management", notes, counts.unroutable, counts.stranded)


def measure(
    config: Settings, queues: list[str], timeout: float = 5.0, *, peek: bool = True
) -> tuple[list[QueueHealth], Literal["management", "amqp"], list[str]]:
    """The numbers of ``queues``, the source of the sampled ones, and what could not be measured,
    within ``timeout`` seconds in all. Raises ConnectionError when RabbitMQ cannot be reached over
    AMQP in that time."""
    measured = _measure(config, queues, timeout, Deadline(timeout), peek)
    return measured.queues, measured.source, measured.notes


def _add_scheduled(measured: list[QueueHealth], found: dict[str, Scheduled]) -> None:
    """Fill in each queue's scheduled count and next due time from the state store's index
    (written by the job-status writer: nothing when ``JOB_STATUS`` is off)."""
    for health in measured:
        counted = found[health.queue]
        health.scheduled, health.next_due_at = counted.count, counted.next_due_at
        health.scheduled_soon = counted.soon


def queue_depths(
    config: Settings, queues: list[str], timeout: float = 5.0, state: StateStore | None = None
) -> dict[str, dict[str, int | None]]:
    """Waiting, unacked, delayed, scheduled, dead and consumers per queue (the metrics server's
    gauges), within ``timeout`` seconds in all; scheduled only with ``state`` and while it answers
    in time."""
    deadline = Deadline(timeout)
    scheduled = None
    if state is not None:
        scheduled = Call("state", lambda: status_backend(state).scheduled(queues), deadline, _lane(state))
    measured = _measure(config, queues, timeout, deadline, peek=False).queues
    if scheduled is not None:
        with contextlib.suppress(StoreUnavailable, Late):
            _add_scheduled(measured, scheduled.result())
    return {
        h.queue: {
            "waiting": h.waiting,
            "unacked": h.in_progress,
            "delayed": h.delayed,
            "scheduled": h.scheduled,
            "dead": h.dead,
            "consumers": h.consumers,
        }
        for h in measured
    }


def _judge(health: QueueHealth, config: Settings) -> None:
    problems = health.problems
    if health.waiting is not None and health.waiting > config.health_max_waiting:
        problems.append(Problem("backlog", f"waiting {health.waiting} > {config.health_max_waiting}"))
    if health.dead is not None and health.dead > config.health_max_dead_letters:
        problems.append(
            Problem("dead_letters", f"dead letters {health.dead} > {config.health_max_dead_letters}")
        )
    if health.oldest_age_s is not None and health.oldest_age_s * 1000 > config.health_max_age_ms:
        limit = config.health_max_age_ms / 1000
        problems.append(Problem("oldest_age", f"oldest waiting {health.oldest_age_s:.0f} s > {limit:g} s"))
    stuck = _never_run(health)
    if stuck:
        problems.append(Problem("no_consumers", stuck))


def _never_run(health: QueueHealth) -> str | None:
    """Why jobs of ``health``'s queue will not run, if they will not: nobody consumes the queue
    while jobs wait in it, in its delay queue (a retry's backoff, a short delay) or in the delay
    cascade due soon; or nobody consumes its delay queue (Dramatiq's worker consumes it apart,
    holding each message until its eta) while messages wait there.

    Scheduled jobs count only when due within the delay horizon, either side: one due later is
    not late yet (the next check judges it); one due longer ago has left the cascade and is
    counted in the queue or its delay queue, or is an index entry of a message purged or lost,
    kept until the records' TTL, which must not hold the queue degraded."""
    pending = {
        "waiting": health.waiting,
        "delayed": health.delayed,
        "scheduled due soon": health.scheduled_soon,
    }
    if health.consumers == 0 and any(pending.values()):
        return "no consumers, " + ", ".join(f"{n} {what}" for what, n in pending.items() if n)
    if health.delay_consumers == 0 and health.delayed:
        return f"no consumers of {health.queue}.DQ, {health.delayed} delayed"
    return None


def _totals(
    state: StateStore, queues: list[str], soon_ms: int
) -> tuple[dict[str, Scheduled], dict[str, dict[str, int]]]:
    backend = status_backend(state)
    return backend.scheduled(queues, soon_ms), backend.counts(queues)


def check(
    queues: list[str],
    *,
    config: Settings,
    state: StateStore,
    timeout: float = 5.0,
    deadline: Deadline | None = None,
) -> HealthReport:
    """Measure ``queues`` and judge each against the ``HEALTH_*`` thresholds, within ``timeout``
    seconds in all (or by ``deadline``, one the caller started before: ``jobctl health`` checks
    its ``--queue`` names first); a state store that does not answer in that time degrades the
    report too (every guarded job is deferred meanwhile)."""
    deadline = deadline or Deadline(timeout)
    soon_ms = config.delay_horizon_ms
    totals = Call("state", lambda: _totals(state, queues, soon_ms), deadline, _lane(state))
    try:
        measured = _measure(config, queues, timeout, deadline, peek=True)
    except ConnectionError as exc:
        causes = {"unreachable": str(exc)}
        return _logged(HealthReport("unreachable", [], error=unreachable("RabbitMQ", exc), causes=causes))
    report = HealthReport("healthy", measured.queues, measured.source, measured.notes)
    if measured.cause is not None:
        report.causes["management"] = measured.cause
    try:
        scheduled, counts = totals.result()
    except (StoreUnavailable, Late) as exc:
        report.problems.append(Problem("state_store", store_outage(exc, "no totals")))
        report.causes["state_store"] = str(exc)
    else:
        _add_scheduled(report.queues, scheduled)
        for health in report.queues:
            health.succeeded = counts[health.queue].get("succeeded", 0)
            health.failed = counts[health.queue].get("dead", 0)
    if measured.stranded:
        detail = (
            f"{measured.stranded} delayed messages found no delay queue, waiting in {measured.unroutable}"
        )
        report.problems.append(Problem("unroutable_delays", detail))
    for health in report.queues:
        _judge(health, config)
    if report.problems or any(h.problems for h in report.queues):
        report.status = "degraded"
    return _logged(report)


def _logged(report: HealthReport) -> HealthReport:
    """``report``, its causes logged at DEBUG (``LOG_LEVEL=DEBUG jobctl health`` shows them)."""
    if report.causes:
        logger.debug("health_unreachable", causes=report.causes)
    return report
