"""A worker process's heartbeat on the real store backends: a clean stop is the last word."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest
from dramatiq.brokers.stub import StubBroker

from jobsystem.store.base import StateStore
from middleware.heartbeat import Heartbeat


class _Beats:
    """The store's heartbeats, wrapped: each test's subclass changes how a beat is written."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.beats = 0

    def beat(self, worker_id: str, record: dict[str, Any], now_ms: int) -> None:
        self.beats += 1
        self.backend.beat(worker_id, record, now_ms)

    def workers(self, now_ms: int) -> list[dict[str, Any]]:
        return list(self.backend.workers(now_ms))


class _SlowFirstBeat(_Beats):
    """The first beat (the thread's) slow to be written."""

    def __init__(self, backend: Any) -> None:
        super().__init__(backend)
        self.entered, self.written = threading.Event(), threading.Event()

    def beat(self, worker_id: str, record: dict[str, Any], now_ms: int) -> None:
        first = self.beats == 0
        if first:
            self.entered.set()
            time.sleep(0.3)
        super().beat(worker_id, record, now_ms)
        if first:
            self.written.set()


class _Killed(BaseException):
    """What ends a thread whatever it catches (as SystemExit would)."""


class _FailingSecondBeat(_Beats):
    """The thread's second beat failing with ``error``: a bug's error, not StoreUnavailable."""

    error: BaseException = RuntimeError("not a StoreUnavailable")
    failed = False

    def __init__(self, backend: Any) -> None:
        super().__init__(backend)
        self.third = threading.Event()

    def beat(self, worker_id: str, record: dict[str, Any], now_ms: int) -> None:
        if self.beats == 1 and not self.failed:
            self.failed = True
            raise self.error
        super().beat(worker_id, record, now_ms)
        if self.beats >= 2:
            self.third.set()


class _KilledSecondBeat(_FailingSecondBeat):
    error = _Killed()


class _HungStop(_Beats):
    """The final beat (``stopped_at``) hanging until ``released``; notes which thread wrote each."""

    def __init__(self, backend: Any) -> None:
        super().__init__(backend)
        self.writers: list[str] = []
        self.beaten, self.released = threading.Event(), threading.Event()

    def beat(self, worker_id: str, record: dict[str, Any], now_ms: int) -> None:
        self.writers.append(threading.current_thread().name)
        if "stopped_at" in record:
            self.released.wait(5)
        super().beat(worker_id, record, now_ms)
        self.beaten.set()


B = TypeVar("B", bound=_Beats)


class _Unstartable(threading.Thread):
    def start(self) -> None:
        raise RuntimeError("can't start new thread")


def _worker() -> Any:
    return SimpleNamespace(worker_threads=2, consumers={"q": None})


def _booted(store: StateStore, beats: type[B], interval: float = 60) -> tuple[Heartbeat, B]:
    """A heartbeat on ``store`` through ``beats``, its worker booted (its thread started)."""
    heartbeat = Heartbeat(store, interval=interval)
    backend = beats(heartbeat.backend)
    heartbeat.backend = backend  # type: ignore[assignment]
    heartbeat.after_worker_boot(StubBroker(), _worker())
    return heartbeat, backend


def _stop(heartbeat: Heartbeat) -> dict[str, Any]:
    """Stop the worker as Dramatiq does (both hooks), and give its record as stored."""
    broker, worker = StubBroker(), _worker()
    heartbeat.before_worker_shutdown(broker, worker)
    heartbeat.after_worker_shutdown(broker, worker)
    (record,) = heartbeat.backend.workers(int(time.time() * 1000))
    return record


def test_a_beat_in_flight_at_the_stop_does_not_overwrite_the_stopped_record(store: StateStore):
    heartbeat, backend = _booted(store, _SlowFirstBeat)
    assert backend.entered.wait(5)
    record = _stop(heartbeat)
    assert backend.written.is_set()
    assert record.get("stopped_at") is not None, record


def test_a_stop_is_recorded_when_the_beat_thread_died(store: StateStore, monkeypatch):
    # The final record used to be written only by the beat thread: one killed by an unexpected
    # error left its last beat without stopped_at, and the dashboard showed the worker as gone.
    died: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))
    heartbeat, _ = _booted(store, _KilledSecondBeat, interval=0.01)
    assert heartbeat._thread is not None
    heartbeat._thread.join(5)
    assert not heartbeat._thread.is_alive() and isinstance(died[0], _Killed)
    record = _stop(heartbeat)
    assert record.get("stopped_at") is not None, record
    assert record["queues"] == ["q"] and record["threads"] == 2


def test_an_error_in_one_beat_does_not_end_the_beating(store: StateStore, caplog):
    # A beat that failed with an error other than StoreUnavailable used to end the thread: the
    # worker, alive and working, was shown gone once its last beat aged out.
    heartbeat, backend = _booted(store, _FailingSecondBeat, interval=0.01)
    assert backend.third.wait(5), "no beat after the failed one"
    assert heartbeat._thread is not None and heartbeat._thread.is_alive()
    assert "heartbeat_beat_error" in caplog.messages
    record = _stop(heartbeat)
    assert record.get("stopped_at") is not None, record
    assert "heartbeat_stop_from_shutdown" not in caplog.messages  # the thread wrote it


def test_a_stop_is_recorded_when_the_beat_thread_never_started(store: StateStore, monkeypatch):
    heartbeat = Heartbeat(store, interval=60)
    monkeypatch.setattr("middleware.heartbeat.threading", SimpleNamespace(Thread=_Unstartable))
    with pytest.raises(RuntimeError):  # Dramatiq logs it and boots on
        heartbeat.after_worker_boot(StubBroker(), _worker())
    record = _stop(heartbeat)
    assert record.get("stopped_at") is not None, record


def test_a_beat_thread_still_writing_after_the_wait_stays_the_one_writer(store: StateStore, monkeypatch):
    monkeypatch.setattr("middleware.heartbeat.JOIN_TIMEOUT_S", 0.2)
    heartbeat, backend = _booted(store, _HungStop)
    assert backend.beaten.wait(5)
    _stop(heartbeat)  # returns while the final write hangs, with the record of the first beat
    assert heartbeat._thread is not None and heartbeat._thread.is_alive()
    backend.released.set()
    heartbeat._thread.join(5)
    assert backend.writers == ["heartbeat", "heartbeat"]  # its first beat and its last word
    (record,) = backend.workers(int(time.time() * 1000))
    assert record.get("stopped_at") is not None, record
