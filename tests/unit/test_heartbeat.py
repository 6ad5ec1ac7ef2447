"""A worker process's heartbeat on the real store backends: a clean stop is the last word."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
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


class _FailingSecondBeat:
    """The store's heartbeats, the thread's second beat failing with an error of a bug."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.beats = 0

    def beat(self, worker_id: str, record: dict[str, Any], now_ms: int) -> None:
        self.beats += 1
        if self.beats == 2:
            raise RuntimeError("not a StoreUnavailable")
        self.backend.beat(worker_id, record, now_ms)

    def workers(self, now_ms: int) -> list[dict[str, Any]]:
        return list(self.backend.workers(now_ms))


class _Unstartable(threading.Thread):
    def start(self) -> None:
        raise RuntimeError("can't start new thread")


def _stop(heartbeat: Heartbeat, broker: StubBroker, worker: Any) -> dict[str, Any]:
    """Stop the worker as Dramatiq does, and give its record as stored."""
    heartbeat.before_worker_shutdown(broker, worker)
    heartbeat.after_worker_shutdown(broker, worker)
    (record,) = heartbeat.backend.workers(int(time.time() * 1000))
    return record


def test_a_stop_is_recorded_when_the_beat_thread_died(store: StateStore, monkeypatch):
    # The final record used to be written only by the beat thread: one killed by an unexpected
    # error left its last beat without stopped_at, and the dashboard showed the worker as gone.
    died: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))
    heartbeat = Heartbeat(store, interval=0.01)
    heartbeat.backend = _FailingSecondBeat(heartbeat.backend)  # type: ignore[assignment]
    broker, worker = StubBroker(), SimpleNamespace(worker_threads=2, consumers={"q": None})
    heartbeat.after_worker_boot(broker, worker)  # type: ignore[arg-type]
    assert heartbeat._thread is not None
    heartbeat._thread.join(5)
    assert not heartbeat._thread.is_alive() and isinstance(died[0], RuntimeError)
    record = _stop(heartbeat, broker, worker)
    assert record.get("stopped_at") is not None, record
    assert record["queues"] == ["q"] and record["threads"] == 2


def test_a_stop_is_recorded_when_the_beat_thread_never_started(store: StateStore, monkeypatch):
    heartbeat = Heartbeat(store, interval=60)
    monkeypatch.setattr("middleware.heartbeat.threading", SimpleNamespace(Thread=_Unstartable))
    broker, worker = StubBroker(), SimpleNamespace(worker_threads=2, consumers={"q": None})
    with pytest.raises(RuntimeError):  # Dramatiq logs it and boots on
        heartbeat.after_worker_boot(broker, worker)  # type: ignore[arg-type]
    record = _stop(heartbeat, broker, worker)
    assert record.get("stopped_at") is not None, record


class _HungStop:
    """The store's heartbeats, the final one (``stopped_at``) hanging until ``released``."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.writers: list[str] = []
        self.beaten, self.released = threading.Event(), threading.Event()

    def beat(self, worker_id: str, record: dict[str, Any], now_ms: int) -> None:
        self.writers.append(threading.current_thread().name)
        if "stopped_at" in record:
            self.released.wait(5)
        self.backend.beat(worker_id, record, now_ms)
        self.beaten.set()

    def workers(self, now_ms: int) -> list[dict[str, Any]]:
        return list(self.backend.workers(now_ms))


def test_a_beat_thread_still_writing_after_the_wait_stays_the_one_writer(store: StateStore, monkeypatch):
    monkeypatch.setattr("middleware.heartbeat.JOIN_TIMEOUT_S", 0.2)
    heartbeat = Heartbeat(store, interval=60)
    backend = heartbeat.backend = _HungStop(heartbeat.backend)  # type: ignore[assignment]
    broker, worker = StubBroker(), SimpleNamespace(worker_threads=2, consumers={"q": None})
    heartbeat.after_worker_boot(broker, worker)  # type: ignore[arg-type]
    assert backend.beaten.wait(5)
    heartbeat.before_worker_shutdown(broker, worker)  # type: ignore[arg-type]
    heartbeat.after_worker_shutdown(broker, worker)  # type: ignore[arg-type]
    assert heartbeat._thread is not None and heartbeat._thread.is_alive()  # the final write hangs
    backend.released.set()
    heartbeat._thread.join(5)
    assert backend.writers == ["heartbeat", "heartbeat"]  # its first beat and its last word
    (record,) = backend.workers(int(time.time() * 1000))
    assert record.get("stopped_at") is not None, record
