"""Review 6 of the throughput paths: faults reproduced in-process, at the store and channel boundary.

Each test is a strict xfail: it fails today because of the fault it names, and passes once fixed.

- A keyed job's completion is written by the background writer after the job's ack has left: a
  store that does not take it at once (a failover's ``READONLY``, a timeout) and a SIGKILL then
  lose it, and a copy of the message (a publisher's retry after a lost confirm, a workflow step
  sent twice) runs the job a second time once the lease lapses.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

import middleware.idempotency as idempotency_module
from jobsystem.store.base import StateStore
from jobsystem.store.redis import redis_error
from tests.unit.consumer_standins import Connection, Frames, consumer_of, delivered
from tests.unit.idempotency_setup import Setup, set_up

#: The longest a test waits for the ack frame to leave (a fixed consumer may wait for the store).
ACK_WITHIN_S = 10.0


@pytest.fixture
def idem(store: StateStore) -> Iterator[Setup]:
    yield from set_up(store)


class StoreFailsOver:
    """The completion write while the store fails over: its first ``failures`` tries time out
    (transient: the writer retries them), then it is written."""

    __qualname__ = "_complete_many"

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.write = idempotency_module._complete_many

    def __call__(self, view: StateStore, items: list[Any]) -> None:
        if self.failures:
            self.failures -= 1
            raise redis_error(redis.exceptions.TimeoutError("Timeout reading from socket"))
        self.write(view, items)


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="review6: a keyed job's completion is written after its ack leaves (background writer); "
    "a store slow to take it plus a SIGKILL loses it, and a copy of the message runs again",
)
def test_a_keyed_jobs_ack_leaves_only_once_its_completion_is_in_the_store(
    idem: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(idempotency_module, "_complete_many", StoreFailsOver(failures=2))
    channel = Frames(on_ack=lambda: idem.state("order-7"))
    consumer = consumer_of(idem.broker, Connection(), channel)
    proxy = delivered(consumer, idem.message("order-7"))
    # What the worker thread does: the hooks, the actor (returns), the hooks, then the ack.
    idem.middleware.before_process_message(idem.broker, proxy)
    idem.middleware.after_process_message(idem.broker, proxy, result=None)
    idem.broker.emit_before("ack", proxy)
    consumer.ack(proxy)
    idem.broker.emit_after("ack", proxy)
    assert channel.sent.wait(ACK_WITHIN_S), "the ack never left"
    # The state of the key when the ack frame was queued: once acked, RabbitMQ forgets the
    # message; a completion still in this process's memory dies with it (SIGKILL, OOM kill).
    assert channel.acked == [(proxy.tag, "done")]
