"""The scheduler's stop request (``scheduler.stopping``): a signal handler that lands while the
main thread holds the stop event's lock still stops the scheduler, instead of waiting forever
for a lock its own thread holds."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator

import pytest

from scheduler.stopping import StopRequest


@pytest.fixture
def on_sigterm() -> Iterator[StopRequest]:
    """A SIGTERM handler that notes the signal on a fresh request, as ``python -m scheduler``'s does."""
    request = StopRequest()
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: request.note_signal("SIGTERM"))
    yield request
    signal.signal(signal.SIGTERM, previous)


@pytest.mark.timeout(10)
def test_a_signal_while_the_main_thread_holds_the_events_lock_returns_and_stops(on_sigterm):
    request = on_sigterm
    with request._event._cond:  # as inside Event.wait, just before it blocks
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, in this thread
        assert request.is_set()
    request.wait()  # returns: the main thread turns the note into the stop
    assert request.signal == "SIGTERM"


@pytest.mark.timeout(10)
def test_wait_returns_once_a_signal_is_noted():
    request = StopRequest()
    returned = threading.Event()

    def main() -> None:
        request.wait()
        returned.set()

    waiter = threading.Thread(target=main)
    waiter.start()
    request.note_signal("SIGINT")
    assert returned.wait(5)
    waiter.join()
    assert request.signal == "SIGINT"


@pytest.mark.timeout(10)
def test_a_stop_from_another_thread_wakes_the_waiter_at_once():
    request = StopRequest()
    waiter = threading.Thread(target=request.wait)
    waiter.start()
    assert not request.is_set()
    request.set()
    waiter.join(5)
    assert not waiter.is_alive() and request.is_set() and request.signal is None
