"""A publish interrupted while it waits for RabbitMQ's confirm costs its thread's connection.

An interrupt (Dramatiq's ``TimeLimitExceeded``, ``Shutdown``, the project's ``JobCancelled``) raised
in a worker thread while its publish waits for RabbitMQ's confirm left the thread's channel in place
with that confirm still to come. pika's ``BlockingChannel`` matches confirms to publishes by
arrival, not by delivery tag: the thread's next publish (a retry, a deferral, a dead letter, a send)
returned on the stale confirm, before RabbitMQ said anything about it. A publish RabbitMQ then
refused (unroutable, nacked) was reported as confirmed, and the delivery behind it acked: lost.
Every confirmed publish of the broker (a send, a delay into the cascade, a dead letter) now drops
the thread's connection when anything is raised out of it (found in review 6).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import dramatiq
import pika.exceptions
import pytest
from dramatiq.middleware.time_limit import TimeLimitExceeded

from jobsystem.rabbitmq.broker import ProjectBroker
from jobsystem.system import get_system
from tests.queues import delete_prefixed

#: Ample time for RabbitMQ's confirm of the interrupted publish to reach the socket (local broker).
CONFIRM_ARRIVES_S = 0.2


@pytest.fixture
def broker(prefix: str) -> Iterator[ProjectBroker]:
    """A project broker with publisher confirms and no middleware, its topology under the test's
    prefix (deleted after)."""
    settings = get_system().settings
    url = settings.rabbitmq_url.split(";")[0]
    broker = ProjectBroker(
        environment=prefix, delay_prefix=prefix, url=url, confirm_delivery=True, middleware=[]
    )
    yield broker
    broker.close()
    delete_prefixed(settings, prefix)


def interrupt_after_next_publish_leaves(channel: Any) -> None:
    """The next publish on ``channel`` is interrupted once its frame is written, before its confirm
    is read: as a time limit lands in a thread waiting in pika's I/O loop (between bytecodes)."""
    connection = channel.connection
    flush, publish = connection._flush_output, channel._impl.basic_publish

    def interrupted(*waiters: Any) -> None:
        flush()  # the frame leaves; the confirm is not waited for
        del connection._flush_output
        raise TimeLimitExceeded()

    def publish_then_interrupt(*args: Any, **kwargs: Any) -> None:
        del channel._impl.basic_publish
        publish(*args, **kwargs)
        connection._flush_output = interrupted

    channel._impl.basic_publish = publish_then_interrupt


def send(broker: ProjectBroker, queue: str) -> None:
    broker.enqueue(dramatiq.Message(queue, "job", (), {}, {}))


def send_delayed(broker: ProjectBroker, queue: str) -> None:
    """Into the delay cascade (a delay past the broker's horizon)."""
    broker.enqueue(dramatiq.Message(queue, "job", (), {}, {}), delay=broker.delay_horizon_ms + 60_000)


def dead_letter(broker: ProjectBroker, queue: str) -> None:
    broker.publish_dead_letter(b"{}", {}, "m-1", queue)


@pytest.mark.parametrize("publish", [send, send_delayed, dead_letter])
def test_after_an_interrupted_publish_a_refused_publish_is_not_reported_as_confirmed(
    broker: ProjectBroker, prefix: str, publish: Callable[[ProjectBroker, str], None]
) -> None:
    queue = f"{prefix}work"
    broker.declare_queue(queue, ensure=True)
    interrupt_after_next_publish_leaves(broker.channel)
    with pytest.raises(TimeLimitExceeded):
        publish(broker, queue)
    time.sleep(CONFIRM_ARRIVES_S)  # its confirm reaches the socket, unread: the stale confirm
    # The thread's next publish goes nowhere: RabbitMQ returns it (mandatory), and the channel in
    # confirm mode must raise, as it does with no confirm outstanding. On the interrupted channel
    # it returned on the stale confirm (or, when that confirm and its own are read at once, pika's
    # confirm result is set twice and the connection dies: AssertionError('_CallbackResult was
    # already set')).
    try:
        broker.channel.basic_publish(exchange="", routing_key=f"{prefix}nowhere", body=b"{}", mandatory=True)
    except pika.exceptions.UnroutableError:
        outcome = "refused"
    except pika.exceptions.AMQPConnectionError as exc:
        outcome = f"connection lost: {exc}"
    else:
        outcome = "reported as confirmed"
    assert outcome == "refused"
