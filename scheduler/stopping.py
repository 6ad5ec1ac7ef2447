"""A stop request that a signal handler can make without taking a lock.

A Python signal handler runs in the main thread, between two bytecodes of whatever the main
thread was doing. The scheduler's main thread spends its life in ``Event.wait()``, and
``Event.set()`` takes the same non-reentrant lock that ``wait`` holds for a moment before it
blocks: a SIGTERM landing in that moment made the handler wait for a lock its own thread held,
and the scheduler never stopped (seen once in CI as a test timeout). The handler therefore only
notes the signal (:meth:`StopRequest.note_signal`, a plain attribute write), and the main
thread, waking every :data:`POLL_S`, turns the note into the stop.
"""

from __future__ import annotations

import threading

__all__ = ["POLL_S", "StopRequest"]

#: How often the waiting main thread looks for a signal noted by a handler.
POLL_S = 0.1


class StopRequest:
    """Set by another thread (:meth:`set`) or a signal handler (:meth:`note_signal`); awaited by
    the main thread (:meth:`wait`); checked by any thread (:meth:`is_set`)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        #: The name of the signal that asked for the stop, if one did.
        self.signal: str | None = None

    def set(self, signal_name: str | None = None) -> None:
        """Ask for the stop from any thread, not from a signal handler."""
        self.signal = signal_name
        self._event.set()

    def note_signal(self, signal_name: str) -> None:
        """Ask for the stop from a signal handler: takes no lock."""
        self.signal = signal_name

    def is_set(self) -> bool:
        return self._event.is_set() or self.signal is not None

    def wait(self) -> None:
        """Block until a stop is asked for, by either way."""
        while not self._event.wait(POLL_S):
            if self.signal is not None:
                self._event.set()
