"""The health verdict without RabbitMQ: the queues' numbers stand in (or a server that never
answers does), the state store is real."""

from __future__ import annotations

import functools
import threading
import time

import pytest

from jobsystem.ops import health
from jobsystem.ops.deadline import Lane
from jobsystem.ops.queue_counts import AmqpCounts, QueueCounts
from jobsystem.settings import load_settings
from jobsystem.store.base import StateStore
from jobsystem.store.redis import RedisStore
from jobsystem.store.sqlite import SqliteStore
from jobsystem.store.status import status_backend
from jobsystem.store.status_records import StatusUpdate, order_of
from tests.servers import silent_server
from tests.support import finished_within, fresh_store

#: The health check's timeout in these tests, and the bound it must keep: the timeout, plus time
#: to start its threads and judge on a busy machine (each dependency's own timeout is longer).
TIMEOUT = 1.0
BOUND = TIMEOUT + 1.5


@pytest.fixture
def rabbitmq(monkeypatch: pytest.MonkeyPatch) -> dict[str, QueueCounts]:
    """RabbitMQ as health sees it, without RabbitMQ: the AMQP counts of the queues a test puts in
    the returned dict; the management API knows no queue."""
    counted: dict[str, QueueCounts] = {}
    monkeypatch.setattr(health, "count_queues", lambda *_a, **_kw: AmqpCounts(counted, "delay.unroutable", 0))
    monkeypatch.setattr(health, "queue_stats", lambda *_a, **_kw: {})
    return counted


def schedule(store: StateStore, queue: str, jobs: int, due_in_ms: int = 10_000, name: str = "m") -> None:
    """File ``jobs`` jobs of ``queue`` as waiting in the delay cascade, due in ``due_in_ms``
    (within the default delay horizon, 30 s), as the status writer does."""
    now = int(time.time() * 1000)
    fields = {"state": "scheduled", "updated_at": str(now), "due_at": str(now + due_in_ms)}
    updates = [
        StatusUpdate(f"{name}{i}", queue, order_of(0, "scheduled"), fields, {"queue": queue, "actor": "a"})
        for i in range(jobs)
    ]
    status_backend(store).apply(updates, 86_400_000)


@pytest.mark.parametrize(
    ("counts", "scheduled", "detail"),
    [
        # Retries waiting out their backoff, delayed jobs: Dramatiq's delay queue.
        (
            QueueCounts(waiting=0, consumers=0, delayed=3, delay_consumers=0, dead=0),
            0,
            "no consumers, 3 delayed",
        ),
        # Jobs waiting in RabbitMQ's delay cascade, counted by the state store's index.
        (
            QueueCounts(waiting=0, consumers=0, delayed=0, delay_consumers=0, dead=0),
            1,
            "no consumers, 1 scheduled due soon",
        ),
        (
            QueueCounts(waiting=2, consumers=0, delayed=1, delay_consumers=0, dead=0),
            1,
            "no consumers, 2 waiting, 1 delayed, 1 scheduled due soon",
        ),
        # The queue consumed, its delay queue not: the delayed are never released.
        (
            QueueCounts(waiting=0, consumers=2, delayed=3, delay_consumers=0, dead=0),
            0,
            "no consumers of q.DQ, 3 delayed",
        ),
    ],
)
def test_jobs_that_will_never_run_are_reported(
    rabbitmq: dict[str, QueueCounts], store: StateStore, counts: QueueCounts, scheduled: int, detail: str
):
    rabbitmq["q"] = counts
    schedule(store, "q", scheduled)
    report = health.check(["q"], config=load_settings({}), state=store)
    assert (report.status, report.exit_code) == ("degraded", 1)
    assert [(p.kind, p.detail) for p in report.queues[0].problems] == [("no_consumers", detail)]


def test_jobs_delayed_or_scheduled_with_consumers_to_run_them_are_healthy(
    rabbitmq: dict[str, QueueCounts], store: StateStore
):
    rabbitmq["q"] = QueueCounts(waiting=0, consumers=1, delayed=3, delay_consumers=1, dead=0)
    rabbitmq["idle"] = QueueCounts(waiting=0, consumers=0, delayed=0, delay_consumers=0, dead=0)
    schedule(store, "q", 2)
    report = health.check(["idle", "q"], config=load_settings({}), state=store)
    assert report.status == "healthy", report.to_dict()
    assert {h.queue: (h.delayed, h.scheduled) for h in report.queues} == {"idle": (0, 0), "q": (3, 2)}


def test_only_scheduled_jobs_due_soon_make_a_queue_nobody_consumes_degraded(
    rabbitmq: dict[str, QueueCounts], store: StateStore
):
    """An entry overdue by more than the delay horizon (its message purged or lost: the index
    keeps it until the records' TTL) or due next week does not alert every minute; one due within
    the horizon, soon in the delay queue with nobody to release it, does."""
    rabbitmq["q"] = QueueCounts(waiting=0, consumers=0, delayed=0, delay_consumers=0, dead=0)
    schedule(store, "q", 1, due_in_ms=-3_600_000, name="stale")
    schedule(store, "q", 2, due_in_ms=7 * 86_400_000, name="next-week")
    report = health.check(["q"], config=load_settings({}), state=store)
    assert report.status == "healthy", report.to_dict()
    assert (report.queues[0].scheduled, report.queues[0].scheduled_soon) == (3, 0)

    schedule(store, "q", 1, due_in_ms=20_000, name="soon")
    report = health.check(["q"], config=load_settings({}), state=store)
    assert [(p.kind, p.detail) for p in report.queues[0].problems] == [
        ("no_consumers", "no consumers, 1 scheduled due soon")
    ]
    # The horizon is the setting's: past a 10 s one, the same job is not due soon.
    report = health.check(["q"], config=load_settings({"DELAY_HORIZON_MS": "10000"}), state=store)
    assert report.status == "healthy", report.to_dict()


def test_a_state_store_that_does_not_answer_degrades_the_check(rabbitmq: dict[str, QueueCounts]):
    """Every guarded job is deferred while the store is down: the check must not say healthy."""
    rabbitmq["q"] = QueueCounts(waiting=0, consumers=1, delayed=0, delay_consumers=1, dead=0)
    down = RedisStore("redis://127.0.0.1:1/0", socket_timeout=0.2)
    report = health.check(["q"], config=load_settings({}), state=down)
    assert (report.status, report.exit_code) == ("degraded", 1)
    assert [p.kind for p in report.problems] == ["state_store"]
    assert report.queues[0].verdict == "healthy"  # the queue itself is fine
    assert report.to_dict()["problems"][0]["kind"] == "state_store"


def test_a_state_store_that_hangs_is_named_within_the_bound_with_the_rest_of_the_report(
    rabbitmq: dict[str, QueueCounts],
):
    """Its own timeout (5 s here) is longer than the check's: the check does not wait for it."""
    rabbitmq["q"] = QueueCounts(waiting=2, consumers=1, delayed=0, delay_consumers=1, dead=0)
    with silent_server() as port:
        hanging = RedisStore(f"redis://127.0.0.1:{port}/0", socket_timeout=5)
        report = finished_within(
            BOUND, lambda: health.check(["q"], config=load_settings({}), state=hanging, timeout=TIMEOUT)
        )
    assert report.status == "degraded"
    assert [(p.kind, p.detail) for p in report.problems] == [
        ("state_store", f"state store unreachable, no totals (no answer within {TIMEOUT:g} s)")
    ]
    assert (report.queues[0].waiting, report.queues[0].scheduled, report.queues[0].succeeded) == (
        2,
        None,
        None,
    )


def test_a_rabbitmq_that_accepts_and_never_answers_costs_the_timeout_not_more():
    """pika's handshake timeout (15 s) is not the check's: ``jobctl health``, the check_health job
    and a Prometheus scrape (10 s) get their answer, unreachable, within the bound."""
    with silent_server() as port:
        config = load_settings(
            {
                "RABBITMQ_URL": f"amqp://guest:guest@127.0.0.1:{port}/%2F",
                "RABBITMQ_MANAGEMENT_URL": f"http://127.0.0.1:{port}",
            }
        )
        hanging = RedisStore(f"redis://127.0.0.1:{port}/0", socket_timeout=5)
        report = finished_within(
            BOUND, lambda: health.check(["q"], config=config, state=hanging, timeout=TIMEOUT)
        )
        assert (report.status, report.exit_code, report.queues) == ("unreachable", 2, [])
        with pytest.raises(ConnectionError):  # the scrape's gauges: jobs_queue_stats_up 0
            finished_within(BOUND, lambda: health.queue_depths(config, ["q"], TIMEOUT, hanging))


def test_repeated_checks_ask_an_sqlite_store_on_one_connection(rabbitmq: dict[str, QueueCounts], tmp_path):
    """The store is asked on a thread of its own; an SQLite store opens a connection per thread,
    so a new thread per check (a scrape every 15 s, the dashboard every 2 s) would leak them."""
    rabbitmq["q"] = QueueCounts(waiting=0, consumers=1, delayed=0, delay_consumers=1, dead=0)
    with fresh_store("sqlite", tmp_path) as state:
        assert isinstance(state, SqliteStore)
        assert health.check(["q"], config=load_settings({}), state=state).status == "healthy"
        opened = len(state._connections)
        for _ in range(5):
            assert health.check(["q"], config=load_settings({}), state=state).status == "healthy"
            health.queue_depths(load_settings({}), ["q"], state=state)
        assert len(state._connections) == opened


def test_checks_further_apart_than_the_lane_idles_leave_one_sqlite_connection_at_most(
    rabbitmq: dict[str, QueueCounts], tmp_path, monkeypatch: pytest.MonkeyPatch
):
    """The check_health job runs every minute, past the lane's idle time: its thread has ended
    between checks, and the next check's thread opens a connection of its own. The thread that
    ended must have closed its own, or a worker leaks one (three file descriptors) per minute."""
    monkeypatch.setattr(health, "Lane", functools.partial(Lane, idle=0.5))  # found before it idles out
    rabbitmq["q"] = QueueCounts(waiting=0, consumers=1, delayed=0, delay_consumers=1, dead=0)
    with fresh_store("sqlite", tmp_path) as state:
        assert isinstance(state, SqliteStore)
        for _ in range(4):
            before = set(threading.enumerate())
            assert health.check(["q"], config=load_settings({}), state=state).status == "healthy"
            (lane,) = [t for t in threading.enumerate() if t.name == "health-state" and t not in before]
            lane.join(timeout=10)  # idled out
            assert not lane.is_alive()
            assert len(state._connections) <= 1
