"""The stack's order where a guarantee depends on it: Dramatiq's TimeLimit and
ShutdownNotifications raise an exception in a job's thread at any moment until their own after hook
runs, so every other after hook must run once they have ended (a ``BaseException`` cut through
RateLimits' re-enqueue of a 429'd job, and Dramatiq acked the job: lost)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import dramatiq
from dramatiq import Worker
from dramatiq.middleware import Middleware, Shutdown, ShutdownNotifications, TimeLimit

from jobsystem.limits import Limit
from jobsystem.privacy.setup import get_key_hasher, get_scrubber
from jobsystem.settings import load_settings
from jobsystem.stack import build_middleware
from jobsystem.store import open_store
from middleware.cancellation import ForgetCancelledKeys
from middleware.heartbeat import Heartbeat
from middleware.ratelimit import RateLimited, RateLimits
from tests.unit.stub import RecordingBroker

INTERRUPTING = (TimeLimit, ShutdownNotifications)
AFTER_HOOKS = ("after_process_message", "after_skip_message", "after_nack", "after_ack")


def full_stack(tmp_path: Path) -> list[Middleware]:
    settings = load_settings({"STATE_URL": f"sqlite:///{tmp_path}/state.db", "PROMETHEUS_PORT": "9"})
    store = open_store(settings.state_url, namespace=settings.state_namespace)
    return build_middleware(
        settings, store, scrubber=get_scrubber(settings), key_hasher=get_key_hasher(settings)
    )


def defines_after_hooks(middleware: Middleware) -> bool:
    return any(getattr(type(middleware), hook) is not getattr(Middleware, hook) for hook in AFTER_HOOKS)


def test_every_other_after_hook_runs_once_the_interrupting_middleware_have_ended(tmp_path):
    stack = full_stack(tmp_path)
    first_interrupting = min(i for i, m in enumerate(stack) if isinstance(m, INTERRUPTING))
    settling = [
        type(m).__name__
        for i, m in enumerate(stack)
        if defines_after_hooks(m) and not isinstance(m, (*INTERRUPTING, ForgetCancelledKeys))
    ]
    assert {"RateLimits", "Idempotency", "Status", "Workflows", "SafeRetries"} <= set(settling)
    later = [type(m).__name__ for m in stack[first_interrupting:] if type(m).__name__ in settling]
    assert later == []  # after hooks run in reverse order: these would run inside the deadline


def test_a_time_limit_reached_while_a_429d_job_is_re_enqueued_loses_nothing(tmp_path):
    # TimeLimit and RateLimits in the full stack's order; the deadline checked every 10 ms, and a
    # store that takes 300 ms to drain the bucket: the deadline passes during the re-enqueue.
    order = [m for m in full_stack(tmp_path) if isinstance(m, TimeLimit | RateLimits)]
    store = open_store(f"sqlite:///{tmp_path}/limits.db")
    rate_limits = RateLimits(store, {"api": Limit(rate=20, burst=1)}, wait_ms=0, max_delay_ms=60_000)
    drain_and_take = rate_limits.backend.drain_and_take

    def slow_drain(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.3)
        return drain_and_take(*args, **kwargs)

    rate_limits.backend.drain_and_take = slow_drain  # type: ignore[method-assign]
    time_limit = TimeLimit(time_limit=100, interval=10)
    broker = RecordingBroker([time_limit if isinstance(m, TimeLimit) else rate_limits for m in order])

    @dramatiq.actor(broker=broker, queue_name="q", rate_limit="api")
    def call() -> None:
        time.sleep(0.08)
        raise RateLimited(retry_after=1)

    broker.emit_after("process_boot")
    worker = Worker(broker, worker_threads=1, worker_timeout=10)
    worker.start()
    try:
        sent = call.send()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and len(broker.enqueued) < 2:
            time.sleep(0.01)
    finally:
        worker.stop()
    ((copy, delay),) = broker.enqueued[1:]  # the copy re-enqueued for after the upstream's wait
    assert copy.message_id == sent.message_id
    assert delay is not None and delay >= 1_000 - rate_limits.slot_lead_ms


class _SlowBeats:
    """A store whose heartbeat writes hang until ``released`` (at most 4 s each)."""

    def __init__(self) -> None:
        self.entered, self.released = threading.Event(), threading.Event()

    def beat(self, worker_id: str, record: dict[str, Any], now_ms: int) -> None:
        self.entered.set()
        self.released.wait(4)


def test_a_shutdown_notice_reaches_a_running_job_without_waiting_for_the_heartbeat(tmp_path):
    # Heartbeat's hooks run before ShutdownNotifications' (list order). Its stop used to wait for
    # the beat in flight and then write the final one itself: with a store that hangs, the notice
    # reached the job seconds late (here 8 s: two hung writes).
    order = [m for m in full_stack(tmp_path) if isinstance(m, Heartbeat | ShutdownNotifications)]
    heartbeat, _ = order  # the real stack's order: Heartbeat first
    assert isinstance(heartbeat, Heartbeat)
    beats = heartbeat.backend = _SlowBeats()  # type: ignore[assignment]
    broker = RecordingBroker(order)
    started, noticed = threading.Event(), []

    @dramatiq.actor(broker=broker, queue_name="q", notify_shutdown=True)
    def long_job() -> None:
        started.set()
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                time.sleep(0.01)
        except Shutdown:
            noticed.append(time.monotonic())
            beats.released.set()
            raise

    worker = Worker(broker, worker_threads=1, worker_timeout=10)
    worker.start()
    try:
        long_job.send()
        assert started.wait(5) and beats.entered.wait(5)  # a job running, a beat in flight
    finally:
        stopping = time.monotonic()
        worker.stop()
    assert noticed, "the running job never got its Shutdown notice"
    assert noticed[0] - stopping < 1.0
