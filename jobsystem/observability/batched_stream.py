"""Lifecycle lines of a worker process, sent to Dramatiq's parent process in batches.

Under ``dramatiq`` a worker process's log stream is a pipe to the parent (Dramatiq's
``StreamablePipe``): each ``write`` is one message on it, which the parent's log watcher receives,
writes and flushes on its own. At two lifecycle lines per job that is several system calls in two
processes per line, taken under the handler's lock by every worker thread: it cost more worker CPU
than everything else logging does.

:class:`BatchedStream` wraps such a stream. The short path of lifecycle events
(:mod:`jobsystem.observability.direct_lines`) hands it finished lines with :meth:`~BatchedStream.write_later`;
they are sent together, as one message of whole lines, when they pass ``max_chars`` or at the
latest ``interval`` seconds after the first of them (a daemon thread, started in the process that
writes). Every other write (the ordinary path: warnings and errors, Dramatiq's and pika's records,
``print``) first sends what is pending, in the same message, so the order of lines is kept and
nothing written the ordinary way waits. Queueing a line takes no lock, so a worker thread does
not wait for a send in progress (in a loaded worker one took 0.8 ms on average, up to 9 ms, and a
tenth of the lines waited for the lock, 3.4 ms on average); only the thread whose line fills a
batch sends it, under the lock.

What is pending is sent when the worker shuts down (``JobLifecycle`` calls
:func:`flush_batched_streams` after the worker stopped, before Dramatiq closes the pipe; a SIGTERM
stop loses nothing) and at interpreter exit. A SIGKILL, or a crash that skips both, loses at most
the INFO lifecycle lines of the last ``interval`` (50 ms), never a warning or an error. A forked
child starts with nothing pending (its parent sends its own lines) and a fresh lock and thread.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["BatchedStream", "Line", "flush_batched_streams"]

#: A line queued with :meth:`BatchedStream.write_later`: its text, or what makes its text when the
#: batch is sent (a line rendered off the job's path; it must not raise).
Line = str | Callable[[], str]

#: Pending lines are sent once they reach this many characters: one ``send_bytes`` of at most
#: ~16 KiB is one ``write`` on the pipe (multiprocessing splits larger messages in two).
MAX_CHARS = 16_000
#: ... or this many seconds after the first of them was queued.
INTERVAL = 0.05
#: What a line made at send time counts towards ``max_chars`` (a lifecycle line is ~200).
LATER_CHARS = 256

_streams: weakref.WeakSet[BatchedStream] = weakref.WeakSet()
_hooks_lock = threading.Lock()
_hooks_installed = False


def flush_batched_streams() -> None:
    """Send every batched stream's pending lines now (worker shutdown, interpreter exit)."""
    for stream in list(_streams):
        stream.flush()


def _after_fork_in_child() -> None:
    for stream in list(_streams):
        stream._reset_after_fork()


def _install_hooks() -> None:
    """Process-wide hooks, once, when the first batched stream is made (not at import)."""
    global _hooks_installed
    with _hooks_lock:
        if not _hooks_installed:
            os.register_at_fork(after_in_child=_after_fork_in_child)
            atexit.register(flush_batched_streams)
            _hooks_installed = True


def _flush_loop(ref: weakref.ref[BatchedStream], wake: threading.Event, interval: float) -> None:
    """Body of the flusher thread: after lines are queued, wait ``interval``, send them. Holds the
    stream only weakly, so a stream that is dropped (tests, reconfiguration) lets its thread end."""
    while True:
        if not wake.wait(timeout=5.0):
            if ref() is None:
                return
            continue
        time.sleep(interval)  # lines queued meanwhile go with the first: one send per interval
        stream = ref()
        if stream is None or stream._wake is not wake:
            return  # dropped, or a forked child's copy that has its own thread now
        stream.send_pending()
        del stream


def _made(line: Callable[[], str]) -> str:
    """The text of a line made at send time; a maker that raises (it must not) loses its line,
    not the batch nor the thread sending it."""
    try:
        return line()
    except Exception:
        return ""


class BatchedStream:
    """A text stream that sends :meth:`write_later` lines in batches and :meth:`write` at once.

    Parameters:
      stream: the stream written to (Dramatiq's pipe to its parent process).
      max_chars: pending characters that trigger a send.
      interval: seconds a queued line waits at most (while the process runs).
    """

    def __init__(self, stream: Any, *, max_chars: int = MAX_CHARS, interval: float = INTERVAL) -> None:
        self.stream = stream
        self.max_chars = max_chars
        self.interval = interval
        #: Held while sending, not while queueing.
        self._lock = threading.Lock()
        self._flusher_lock = threading.Lock()
        self._pending: deque[Line] = deque()
        self._chars = 0
        self._wake = threading.Event()
        self._flusher: threading.Thread | None = None
        _install_hooks()
        _streams.add(self)

    def write_later(self, line: Line) -> None:
        """Queue ``line`` (whole lines, with their terminator; or what makes them when the batch is
        sent): sent with the next batch.

        Queueing takes no lock (a thread holding one can lose the GIL for milliseconds, and every
        worker thread logs); the line that fills a batch sends it, under the lock.
        ``deque.append`` is atomic; the send clears ``_wake`` before it takes what is queued, so a
        line it does not take finds ``_wake`` clear and sets it. ``_chars`` is only the cue to
        send early: an increment lost to a race delays that, never a line."""
        self._pending.append(line)
        self._chars += len(line) if type(line) is str else LATER_CHARS
        if not self._wake.is_set():
            self._wake.set()
        if self._chars >= self.max_chars:
            self.send_pending()
        if self._flusher is None:
            self._start_flusher()

    @property
    def pending(self) -> bool:
        """Whether lines wait for the next batch."""
        return bool(self._pending)

    def write(self, text: str) -> int:
        """Send what is pending and ``text`` now, in one write."""
        with self._lock:
            self._send_locked(text)
        return len(text)

    def send_pending(self) -> None:
        """Send what is pending (the flusher thread's work)."""
        with self._lock:
            self._send_locked("")

    def flush(self) -> None:
        """Send what is pending, then flush the wrapped stream."""
        self.send_pending()
        flush = getattr(self.stream, "flush", None)
        if flush is not None:
            with contextlib.suppress(OSError, ValueError):  # closed: logging carries on
                flush()

    def _send_locked(self, text: str) -> None:
        """Send what is queued and ``text`` in one write; under ``_lock``, which keeps sends in order."""
        self._wake.clear()  # before taking the lines: see write_later
        pending = self._pending
        taken = len(pending)  # those queued from now wait for the next send
        if taken:
            self._chars = 0
            # Read, not yet removed: a job's time limit or cancellation is an exception raised in
            # its thread at any moment, here too, and would lose the lines taken out of the queue.
            # (Only this lock's holder removes lines, from the left; others append on the right.)
            lines = [pending[i] for i in range(taken)]
            text = "".join(line if isinstance(line, str) else _made(line) for line in lines) + text
        if text:
            with contextlib.suppress(OSError, ValueError):  # the pipe is closed: as logging does, carry on
                self.stream.write(text)
        for _ in range(taken):
            pending.popleft()

    def _start_flusher(self) -> None:
        with self._flusher_lock:
            if self._flusher is not None:
                return
            self._flusher = threading.Thread(
                target=_flush_loop,
                args=(weakref.ref(self), self._wake, self.interval),
                name="log-batch-flusher",
                daemon=True,
            )
            self._flusher.start()

    def _reset_after_fork(self) -> None:
        """In a forked child: the parent's pending lines are the parent's to send; the lock may
        have been held by a thread that does not exist here; the flusher thread does not exist."""
        self._lock = threading.Lock()
        self._flusher_lock = threading.Lock()
        self._pending = deque()
        self._chars = 0
        self._wake = threading.Event()
        self._flusher = None

    # The rest of the stream interface, as the wrapped stream has it.
    def fileno(self) -> int:
        return int(self.stream.fileno())

    def isatty(self) -> bool:
        return bool(self.stream.isatty())

    def close(self) -> None:
        self.flush()
        self.stream.close()

    @property
    def closed(self) -> bool:
        return bool(self.stream.closed)

    def __getattr__(self, name: str) -> Any:
        if name == "stream":  # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.stream, name)
