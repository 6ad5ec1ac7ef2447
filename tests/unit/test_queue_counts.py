"""Queue counts over AMQP against a RabbitMQ that answers the handshake, then goes silent: past
the handshake pika waits for each answer with no timeout but the heartbeat's (none here, as with
``RABBITMQ_HEARTBEAT=0``), so only the deadline ends the call and closes its socket."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from jobsystem.ops import queue_counts
from jobsystem.ops.deadline import Deadline
from jobsystem.ops.queue_counts import count_queues, missing_queues
from jobsystem.settings import load_settings
from tests.amqp_server import fake_rabbitmq
from tests.servers import silent_server
from tests.support import finished_within

#: The deadline in these tests, and the bound the call must keep (the deadline, plus time for a
#: busy machine).
TIMEOUT = 1.0
BOUND = TIMEOUT + 1.5


@pytest.mark.parametrize(
    "behaviour",
    [{"open_channel": False}, {"declare": False}],
    ids=["silent-at-channel-open", "silent-at-the-first-declare"],
)
def test_a_rabbitmq_silent_after_the_handshake_is_cut_at_the_deadline(behaviour: dict[str, Any]):
    """Each Prometheus scrape, dashboard sample and check_health run would leave one more thread
    and socket waiting forever."""
    with fake_rabbitmq(**behaviour) as rabbit:
        config = load_settings({"RABBITMQ_URL": rabbit.url()})
        with pytest.raises(ConnectionError, match="StreamLostError"):
            finished_within(BOUND, lambda: count_queues(config, ["q"], 5.0, Deadline(TIMEOUT)))
        assert rabbit.closed.wait(1.0), "the socket was left open"
        rabbit.closed.clear()
        with pytest.raises(ConnectionError, match="StreamLostError"):  # jobctl's --queue check
            finished_within(BOUND, lambda: missing_queues(config, ["q"], TIMEOUT))
        assert rabbit.closed.wait(1.0), "the socket was left open"


def test_counts_taken_before_a_close_that_never_completes_are_returned_at_the_deadline():
    with fake_rabbitmq(declare=True, answer_close=False) as rabbit:
        config = load_settings({"RABBITMQ_URL": rabbit.url()})
        counts = finished_within(BOUND, lambda: count_queues(config, ["q"], 5.0, Deadline(TIMEOUT)))
        assert (counts.queues["q"].waiting, counts.stranded) == (0, 0)
        assert rabbit.closed.wait(1.0), "the socket was left open"
        rabbit.closed.clear()
        assert finished_within(BOUND, lambda: missing_queues(config, ["q"], TIMEOUT)) == []
        assert rabbit.closed.wait(1.0), "the socket was left open"


def test_a_cut_due_once_the_socket_is_gone_does_nothing():
    """pika runs callbacks before timers in one turn of its loop: a close answered just before the
    deadline leaves the connection without a transport when the cut comes. Terminating it then
    would raise AttributeError (``None.abort()``) out of the close, over counts already taken."""
    timers: list[Callable[[], None]] = []

    class Impl:
        is_closed = False
        _transport = None
        terminated = False
        ioloop = SimpleNamespace(call_later=lambda delay, callback: timers.append(callback))

        def _terminate_stream(self, error: Exception) -> None:
            self.terminated = True

    impl = Impl()
    queue_counts._cut_at(SimpleNamespace(_impl=impl), Deadline(0.0))
    (cut,) = timers
    cut()
    assert not impl.terminated
    impl._transport = object()  # still connected: the cut drops it
    cut()
    assert impl.terminated


def test_a_rabbitmq_silent_from_the_start_is_unreachable_when_the_handshake_times_out():
    """pika's handshake timeout (set to the time left) raises its own AMQPConnectorStackTimeout,
    not an AMQPError (``open_connection`` makes it a HandshakeTimeout): it escaped as a traceback
    from ``jobctl health --queue`` and, when it came before the check's deadline did (a loaded
    machine), from ``jobctl health`` and the scrape."""
    with silent_server() as port:
        config = load_settings({"RABBITMQ_URL": f"amqp://guest:guest@127.0.0.1:{port}/%2F"})
        with pytest.raises(ConnectionError, match="HandshakeTimeout"):
            finished_within(BOUND, lambda: missing_queues(config, ["q"], TIMEOUT))
        with pytest.raises(ConnectionError, match="HandshakeTimeout"):
            finished_within(BOUND, lambda: count_queues(config, ["q"], TIMEOUT, Deadline(5.0)))
