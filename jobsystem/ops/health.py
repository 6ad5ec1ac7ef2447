"""Queue health: numbers per queue from RabbitMQ and the state store, and a verdict against thresholds.

Used by ``jobctl health`` (exit 0 healthy, 1 degraded, 2 broker unreachable), by the
``check_health`` actor and by the metrics endpoint's queue gauges. Waiting, consumers and dead
letters come from AMQP passive declares (exact, current); unacked, delayed messages held by
workers and rates from the management API (samples refreshed every 5 s); the oldest waiting
message's age by peeking at the head message (:func:`_ready_since`); succeeded and failed totals
from the job-status counters; jobs waiting in RabbitMQ's delay cascade (scheduled, and the next
one's due time) from the state store's scheduled index, since the cascade's queues are shared by
every queue. When the management API does not answer, the verdict rests on the AMQP counts, and
the age is not judged. A state store that does not answer is a problem of the whole system.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal
from urllib.parse import quote

import pika
import pika.exceptions
import requests
from dramatiq import Broker

from jobsystem.rabbitmq.broker import connection_urls, dead_letter_queue
from jobsystem.rabbitmq.delays import DelayCascade
from jobsystem.settings import Settings, redact_url
from jobsystem.store.base import StateStore, StoreUnavailable
from jobsystem.store.status import status_backend

__all__ = [
    "HealthReport",
    "Problem",
    "QueueHealth",
    "add_scheduled",
    "check",
    "measure",
    "missing_queues",
    "own_queue",
    "queue_depths",
    "resolve_queues",
]


@dataclass(frozen=True)
class Problem:
    """One degraded condition: of a queue, ``kind`` backlog, dead_letters, oldest_age or
    no_consumers; of the system, ``state_store`` or ``unroutable_delays``."""

    kind: str
    detail: str


@dataclass
class QueueHealth:
    """The numbers of one queue (None: not measurable from the source at hand), its problems, and
    the kinds of problem this check could not judge (``unjudged``: an unmeasured age)."""

    queue: str
    waiting: int | None = None
    in_progress: int | None = None
    delayed: int | None = None
    scheduled: int | None = None
    next_due_at: int | None = None
    dead: int | None = None
    consumers: int | None = None
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
    ``notes``."""

    status: Literal["healthy", "degraded", "unreachable"]
    queues: list[QueueHealth]
    source: Literal["management", "amqp"] | None = None
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    problems: list[Problem] = field(default_factory=list)
    unjudged: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return {"healthy": 0, "degraded": 1, "unreachable": 2}[self.status]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for queue, health in zip(data["queues"], self.queues, strict=True):
            queue["verdict"] = health.verdict
        return data


def own_queue(settings: Settings, name: str) -> str:
    """The queue ``name`` of this environment: ``QUEUE_PREFIX`` added unless present, so that an
    operator's name never reaches another environment's queue on the same vhost."""
    return name if name.startswith(settings.queue_prefix) else settings.queue(name)


def resolve_queues(settings: Settings, broker: Broker, names: list[str] | None = None) -> list[str]:
    """The queues to check: ``names`` (this environment's, :func:`own_queue`), else every queue
    the actors declared on ``broker``."""
    if names:
        return sorted({own_queue(settings, n) for n in names})
    return sorted(broker.get_declared_queues())


def _vhost_api(config: Settings) -> str:
    return f"{config.management_url}/api/queues/{quote(config.rabbitmq_vhost, safe='')}"


_COLUMNS = (
    "name,messages_ready,messages_unacknowledged,consumers,"
    "message_stats.publish_details.rate,message_stats.ack_details.rate"
)


def _management_stats(config: Settings, timeout: float) -> dict[str, dict[str, Any]]:
    """Every queue of the vhost with the columns health needs, in one request."""
    response = requests.get(_vhost_api(config), params={"columns": _COLUMNS}, timeout=timeout)
    response.raise_for_status()
    return {q["name"]: q for q in response.json()}


def _rate(info: dict[str, Any], name: str) -> float:
    return float(info.get("message_stats", {}).get(f"{name}_details", {}).get("rate", 0.0))


def _connect(config: Settings, timeout: float) -> pika.BlockingConnection:
    """An AMQP connection to the first node that answers (one attempt each, ``timeout`` seconds)."""
    errors: list[str] = []
    for url in connection_urls(config):
        parameters = pika.URLParameters(url)
        parameters.socket_timeout = timeout
        parameters.blocked_connection_timeout = timeout
        parameters.connection_attempts = 1
        try:
            return pika.BlockingConnection(parameters)
        except pika.exceptions.AMQPError as exc:
            errors.append(f"{redact_url(url.split('?')[0])} {type(exc).__name__}")
    raise ConnectionError(", ".join(errors) or "no RabbitMQ node")


class _Passive:
    """Passive declares on one channel (RabbitMQ closes a channel on a missing queue: reopen it)."""

    def __init__(self, connection: pika.BlockingConnection) -> None:
        self.connection = connection
        self.channel = connection.channel()

    def declare(self, name: str) -> tuple[int, int] | None:
        """(ready messages, consumers) of ``name``, exact and current; None for a missing queue."""
        try:
            ok = self.channel.queue_declare(name, passive=True).method
            return int(ok.message_count), int(ok.consumer_count)
        except pika.exceptions.ChannelClosedByBroker:
            self.channel = self.connection.channel()
            return None

    def counts(self, name: str) -> tuple[int, int]:
        """(ready messages, consumers) of ``name``; (0, 0) for a missing queue."""
        return self.declare(name) or (0, 0)


def missing_queues(config: Settings, queues: list[str], timeout: float = 5.0) -> list[str]:
    """Those of ``queues`` RabbitMQ does not have (a typo in ``--queue``); ConnectionError when
    RabbitMQ cannot be reached."""
    connection = _connect(config, timeout)
    try:
        passive = _Passive(connection)
        return [queue for queue in queues if passive.declare(queue) is None]
    except pika.exceptions.AMQPError as exc:
        raise ConnectionError(f"connection lost: {type(exc).__name__}") from exc
    finally:
        if connection.is_open:
            connection.close()


def unroutable_delays(config: Settings, timeout: float = 5.0) -> tuple[str, int]:
    """This environment's ``delay.unroutable`` queue and its messages: delayed jobs whose delay
    queue was gone when they left the delay cascade (deleted, or mid-``migrate-queues``). Nothing
    consumes them: each carries its ``eta`` and belongs in the delay queue its routing key ends
    with, where an operator moves it back (docs/production.md)."""
    name = DelayCascade(config.queue_prefix).unroutable
    connection = _connect(config, timeout)
    try:
        return name, _Passive(connection).counts(name)[0]
    except pika.exceptions.AMQPError as exc:
        raise ConnectionError(f"connection lost: {type(exc).__name__}") from exc
    finally:
        if connection.is_open:
            connection.close()


class _Undated(ValueError):
    """A head message whose ready time cannot be read (not the project's nor Dramatiq's)."""


def _ready_since(peeked: dict[str, Any]) -> float:
    """When a message peeked through the management API became ready in its queue (epoch s).

    The project's publishes carry that time as the AMQP ``timestamp`` property, set on every
    publish into a work queue (a delayed message and a retry are published again when due), and
    read whatever the body's size. Without it (a message of plain Dramatiq): the body's
    ``requeue_timestamp`` or ``message_timestamp``, which predate any delay or backoff.
    """
    stamp = (peeked.get("properties") or {}).get("timestamp")
    if isinstance(stamp, int) and not isinstance(stamp, bool):
        return float(stamp)
    try:
        body = json.loads(peeked["payload"])
        sent = max(int(body["message_timestamp"]), int(body.get("options", {}).get("requeue_timestamp", 0)))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise _Undated("not a Dramatiq message, or cut by the truncation") from exc
    return sent / 1000


def _oldest_age_s(config: Settings, queue: str, timeout: float) -> float | None:
    """Seconds since the head message of ``queue`` became ready; None when none is waiting.
    Raises _Undated when its ready time cannot be read."""
    response = requests.post(
        f"{_vhost_api(config)}/{quote(queue, safe='')}/get",
        json={"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto", "truncate": 65_536},
        timeout=timeout,
    )
    response.raise_for_status()
    peeked = response.json()
    if not peeked:
        return None
    return max(0.0, time.time() - _ready_since(peeked[0]))


def _peek_age(config: Settings, health: QueueHealth, timeout: float, notes: list[str]) -> None:
    """Fill in ``health``'s oldest age, or note why it could not be measured (then not judged)."""
    try:
        health.oldest_age_s = _oldest_age_s(config, health.queue, timeout)
        return
    except requests.RequestException:
        notes.append(f"{health.queue}: could not peek at the oldest message")
    except _Undated:
        notes.append(f"{health.queue}: the oldest message carries no time health can read")
    health.unjudged.append("oldest_age")


def measure(
    config: Settings, queues: list[str], timeout: float = 5.0, *, peek: bool = True
) -> tuple[list[QueueHealth], Literal["management", "amqp"], list[str]]:
    """The numbers of ``queues``, the source of the sampled ones, and what could not be measured.

    Waiting, consumers and dead letters come from AMQP passive declares: exact and current (the
    management API's figures are samples refreshed every ``collect_statistics_interval``, 5 s by
    default). The management API adds unacked, delayed messages held by workers, and rates.
    Raises ConnectionError when RabbitMQ cannot be reached over AMQP.
    """
    connection = _connect(config, timeout)
    measured = []
    try:
        passive = _Passive(connection)
        for queue in queues:
            waiting, consumers = passive.counts(queue)
            measured.append(
                QueueHealth(
                    queue,
                    waiting=waiting,
                    consumers=consumers,
                    delayed=passive.counts(queue + ".DQ")[0],
                    dead=passive.counts(dead_letter_queue(queue))[0],
                )
            )
    except pika.exceptions.AMQPError as exc:
        raise ConnectionError(f"connection lost: {type(exc).__name__}") from exc
    finally:
        if connection.is_open:
            connection.close()
    notes: list[str] = []
    try:
        stats = _management_stats(config, timeout)
    except requests.RequestException as exc:
        notes.append(f"management API unreachable ({type(exc).__name__}): no unacked, rates or age")
        for health in measured:
            health.unjudged.append("oldest_age")
        return measured, "amqp", notes
    for health in measured:
        main, delayed = stats.get(health.queue, {}), stats.get(health.queue + ".DQ", {})
        health.in_progress = int(main.get("messages_unacknowledged", 0))
        health.delayed = (health.delayed or 0) + int(delayed.get("messages_unacknowledged", 0))
        health.publish_rate, health.ack_rate = _rate(main, "publish"), _rate(main, "ack")
        if not peek:
            health.unjudged.append("oldest_age")
        elif health.waiting:
            _peek_age(config, health, timeout, notes)
    return measured, "management", notes


def add_scheduled(measured: list[QueueHealth], state: StateStore) -> None:
    """Fill in each queue's scheduled count and next due time from the state store's index
    (written by the job-status writer: nothing when ``JOB_STATUS`` is off)."""
    found = status_backend(state).scheduled([h.queue for h in measured])
    for health in measured:
        health.scheduled, health.next_due_at = found[health.queue].count, found[health.queue].next_due_at


def queue_depths(
    config: Settings, queues: list[str], timeout: float = 5.0, state: StateStore | None = None
) -> dict[str, dict[str, int | None]]:
    """Waiting, unacked, delayed, scheduled, dead and consumers per queue (the metrics server's
    gauges); scheduled only with ``state`` and while it answers."""
    measured, _, _ = measure(config, queues, timeout, peek=False)
    if state is not None:
        with contextlib.suppress(StoreUnavailable):
            add_scheduled(measured, state)
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
    if health.consumers == 0 and (health.waiting or 0) > 0:
        problems.append(Problem("no_consumers", f"no consumers, {health.waiting} waiting"))


def check(queues: list[str], *, config: Settings, state: StateStore, timeout: float = 5.0) -> HealthReport:
    """Measure ``queues`` and judge each against the ``HEALTH_*`` thresholds; a state store that
    does not answer degrades the report too (every guarded job is deferred meanwhile)."""
    try:
        measured, source, notes = measure(config, queues, timeout)
    except ConnectionError as exc:
        return HealthReport("unreachable", [], error=str(exc))
    report = HealthReport("healthy", measured, source, notes)
    try:
        add_scheduled(report.queues, state)
        counts = status_backend(state).counts(queues)
        for health in report.queues:
            health.succeeded = counts[health.queue].get("succeeded", 0)
            health.failed = counts[health.queue].get("dead", 0)
    except StoreUnavailable as exc:
        report.problems.append(Problem("state_store", f"state store unreachable, no totals ({exc})"))
    try:
        name, stranded = unroutable_delays(config, timeout)
    except ConnectionError as exc:
        report.notes.append(f"delay.unroutable not measured ({exc})")
        report.unjudged.append("unroutable_delays")  # an alert on it stays open
    else:
        if stranded:
            detail = f"{stranded} delayed messages found no delay queue, waiting in {name}"
            report.problems.append(Problem("unroutable_delays", detail))
    for health in report.queues:
        _judge(health, config)
    if report.problems or any(h.problems for h in report.queues):
        report.status = "degraded"
    return report
