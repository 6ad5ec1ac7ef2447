"""Calls run side by side under one deadline: the health check asks RabbitMQ, its management API
and the state store at once, and waits for none of them past the deadline.

Asked in series, each with its own timeout, the waits add up, and a Prometheus scrape (10 s by
default) fails exactly when one dependency is slow. A call that misses the deadline is reported
as :class:`Late` by its caller; it runs in a daemon thread, so neither a caller nor the process's
exit waits for it, and each call bounds itself: the management API's request by shutting its
socket down at the deadline (:mod:`jobsystem.ops.management_http`), the state store's call with
its own timeout, the AMQP counts by dropping their connection at the deadline
(past the handshake, pika waits for an answer with no timeout but the heartbeat's).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Call", "Deadline", "Lane", "Late"]

T = TypeVar("T")


class Late(TimeoutError):
    """A call that had not finished when the deadline passed."""


class Deadline:
    """A point in time ``seconds`` from now."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def remaining(self) -> float:
        """Seconds left, 0 once past."""
        return max(0.0, self.end - time.monotonic())

    def within(self, timeout: float) -> float:
        """``timeout``, shortened to what is left (a call started late must not outlast the deadline)."""
        return min(timeout, self.remaining())


class Lane:
    """One daemon thread that runs the calls given to it in turn, started on first use (again in a
    forked child) and ended after ``idle`` seconds without one, calling ``on_exit`` on it as it ends.
    For a client bound to its thread, such as an SQLite store's connection: a thread per call would
    open one more at every check, and a thread that ends must give its own back (``on_exit``), or
    a check every minute, past the idle time, opens one more each time."""

    def __init__(self, name: str, idle: float = 60.0, on_exit: Callable[[], None] | None = None) -> None:
        self.name = name
        self.idle = idle
        self._on_exit = on_exit
        self._lock = threading.Lock()
        self._pid = 0
        self._jobs: queue.SimpleQueue[Callable[[], None]] | None = None

    def run(self, job: Callable[[], None]) -> None:
        with self._lock:
            if self._jobs is None or self._pid != os.getpid():
                self._pid, self._jobs = os.getpid(), queue.SimpleQueue()
                threading.Thread(target=self._serve, args=(self._jobs,), name=self.name, daemon=True).start()
            self._jobs.put(job)

    def _serve(self, jobs: queue.SimpleQueue[Callable[[], None]]) -> None:
        while True:
            try:
                job = jobs.get(timeout=self.idle)
            except queue.Empty:
                with self._lock:  # no job is added meanwhile: it would wait for a thread gone
                    if jobs.empty():
                        if self._jobs is jobs:
                            self._jobs = None
                        break
                continue
            job()
        if self._on_exit is not None:
            self._on_exit()


class Call(Generic[T]):
    """``function()`` running in a daemon thread from now on (its own, or ``lane``'s when given;
    not run at all if ``deadline`` passed before the lane came to it); :meth:`result` waits for it."""

    def __init__(
        self, name: str, function: Callable[[], T], deadline: Deadline, lane: Lane | None = None
    ) -> None:
        self._function = function
        self.deadline = deadline
        self._done = threading.Event()
        self._value: list[T] = []  # its one value, once returned
        self._error: BaseException | None = None
        if lane is None:
            threading.Thread(target=self._run, name=f"health-{name}", daemon=True).start()
        else:
            lane.run(self._run)

    def _run(self) -> None:
        try:
            if not self.deadline.remaining():
                raise Late("not started before the deadline")
            self._value.append(self._function())
        except BaseException as exc:  # handed to the caller, which decides
            self._error = exc
        finally:
            self._done.set()

    def result(self) -> T:
        """The call's value, or its exception raised here; :class:`Late` past the deadline."""
        if not self._done.wait(self.deadline.remaining()):
            raise Late(f"no answer within {self.deadline.seconds:g} s")
        if self._error is not None:
            raise self._error
        return self._value[0]
