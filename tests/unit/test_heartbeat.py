"""A worker process's heartbeat on the real store backends: a clean stop is the last word."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

from dramatiq.brokers.stub import StubBroker

from jobsystem.store.base import StateStore
from middleware.heartbeat import Heartbeat


class _SlowFirstBeat:
    """The store's heartbeats, the first beat (the thread's) slow to be written."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.beats = 0
        self.entered, self.written = threading.Event(), threading.Event()

    def beat(self, worker_id: str, record: dict[str, Any], now_ms: int) -> None:
        self.beats += 1
        first = self.beats == 1
        if first:
            self.entered.set()
            time.sleep(0.3)
        self.backend.beat(worker_id, record, now_ms)
        if first:
            self.written.set()

    def workers(self, now_ms: int) -> list[dict[str, Any]]:
        return list(self.backend.workers(now_ms))


def test_a_beat_in_flight_at_the_stop_does_not_overwrite_the_stopped_record(store: StateStore):
    heartbeat = Heartbeat(store, interval=60)
    backend = heartbeat.backend = _SlowFirstBeat(heartbeat.backend)  # type: ignore[assignment]
    broker, worker = StubBroker(), SimpleNamespace(worker_threads=2, consumers={"q": None})
    heartbeat.after_worker_boot(broker, worker)  # type: ignore[arg-type]
    assert backend.entered.wait(5)
    heartbeat.before_worker_shutdown(broker, worker)  # type: ignore[arg-type]
    heartbeat.after_worker_shutdown(broker, worker)  # type: ignore[arg-type]
    assert backend.written.is_set()
    (record,) = backend.workers(int(time.time() * 1000))
    assert record.get("stopped_at") is not None, record
