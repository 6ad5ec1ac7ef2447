"""Idempotency keys end to end: real workers, real RabbitMQ, each state store backend."""

from __future__ import annotations

import signal
import subprocess
import time
from typing import Any

import dramatiq
import pika
import pika.exceptions
import pika.frame
import pytest
import redis as redis_lib
from dramatiq.errors import ConnectionClosed
from dramatiq.middleware import MiddlewareError
from pika.adapters.blocking_connection import BlockingChannel

from jobsystem.rabbitmq.bulk import BulkSendError, send_bulk
from jobsystem.rabbitmq.bulk_publisher import Publisher
from middleware.idempotency import Idempotency
from tests import workload
from tests.senders import sender_broker
from tests.servers import free_port
from tests.support import wait_for
from tests.workers import final_events, wait_for_final_events


@pytest.fixture
def keyed(queues, prefix, state_url):
    """The test's queues, sending through a broker whose middleware uses ``state_url``."""
    return queues.using(sender_broker(prefix, state_url))


def effects(store: redis_lib.Redis, prefix: str, token: str) -> int:
    return store.llen(f"test:{prefix}effect:{token}")


def starts(store: redis_lib.Redis, prefix: str, token: str) -> int:
    return store.llen(f"test:{prefix}started:{token}")


def test_three_sends_with_one_key_run_once(start_worker, keyed, store, prefix, state_url):
    worker = start_worker(STATE_URL=state_url)
    sent = [keyed.send(workload.effect, "k1") for _ in range(3)]
    assert {m.message_id for m in sent} == {sent[0].message_id}
    assert [m.options.get("duplicate", False) for m in sent] == [False, True, True]
    # An explicit message option key works the same, for an actor without a key function.
    records = [
        keyed.send_with_options(workload.record, args=("r1",), idempotency_key="order-42") for _ in range(3)
    ]
    assert {m.message_id for m in records} == {records[0].message_id}
    assert [m.options.get("duplicate", False) for m in records] == [False, True, True]
    finished = keyed.wait_finished([sent[0], records[0]])
    assert {r.state for r in finished.values()} == {"succeeded"}
    # Nothing else was published: with the worker stopped, nothing is left to run.
    assert keyed.left_after_stop([worker], keyed.name(workload.effect)) == 0
    assert effects(store, prefix, "k1") == 1 and store.get(f"test:{prefix}count:record") == "1"
    if state_url.startswith("sqlite"):
        assert "state_store_single_host" in worker.output()


def test_the_same_message_delivered_twice_runs_once(start_worker, keyed, store, prefix, state_url):
    # A copy that arrives while the original holds the key asks again soon (0.5 s, doubling), not
    # only once the holder's 30 s lease would lapse: its final event comes within seconds.
    worker = start_worker(STATE_URL=state_url)
    message = keyed.send(workload.effect, "k2")
    keyed.publish_raw(message)  # the copy RabbitMQ would redeliver, or a client that sent twice
    outcome = wait_for_final_events([worker], {message.message_id: 2}, timeout=15)[message.message_id]
    assert outcome == {"job_succeeded": 1, "duplicate_skipped": 1}
    assert effects(store, prefix, "k2") == 1 and starts(store, prefix, "k2") == 1


def test_two_workers_racing_on_duplicates_run_once(start_worker, keyed, store, prefix, state_url):
    # Both workers consume before the copies are published at once: the publish is the gate.
    # (A short lease: copies deferred behind the running one come back when it would lapse.)
    lease = {"STATE_URL": state_url, "IDEMPOTENCY_LEASE_MS": "3000"}
    workers = [start_worker(processes=1, threads=4, **lease) for _ in range(2)]
    message = keyed.message(workload.effect, "k3", seconds=1.0)
    keyed.wait_consumers(message.queue_name, 2)
    keyed.publish_raw(message, copies=12)
    outcome = wait_for_final_events(workers, {message.message_id: 12})[message.message_id]
    assert outcome == {"job_succeeded": 1, "duplicate_skipped": 11}
    assert effects(store, prefix, "k3") == 1 and starts(store, prefix, "k3") == 1
    # RabbitMQ spread the copies over both workers: they did race.
    assert all(final_events([w], [message.message_id])[message.message_id] for w in workers)


def test_a_job_that_fails_then_succeeds_has_its_effect_once(start_worker, keyed, store, prefix, state_url):
    worker = start_worker(STATE_URL=state_url, JOB_MIN_BACKOFF_MS="100")
    message = keyed.send(workload.effect, "k4", failures=2)
    (record,) = keyed.wait_finished([message]).values()
    assert (record.state, record.attempts) == ("succeeded", 3)
    assert effects(store, prefix, "k4") == 1 and starts(store, prefix, "k4") == 3
    # A later duplicate send finds the key completed: dropped at send, nothing runs.
    again = keyed.send(workload.effect, "k4")
    assert again.options.get("duplicate") is True and again.message_id == message.message_id
    assert keyed.left_after_stop([worker], keyed.name(workload.effect)) == 0  # nothing was published
    assert starts(store, prefix, "k4") == 3


def test_sigkill_of_the_claim_holder_runs_the_job_once_after_redelivery(
    start_worker, keyed, store, prefix, state_url
):
    lease = {"STATE_URL": state_url, "IDEMPOTENCY_LEASE_MS": "3000"}
    first = start_worker(**lease)
    message = keyed.send(workload.effect, "k5", seconds=2.0)
    wait_for(lambda: starts(store, prefix, "k5") == 1, what="the first start")
    first.kill()
    first.proc.wait(10)
    second = start_worker(**lease)
    outcome = wait_for_final_events([second], {message.message_id: 1})[message.message_id]
    assert outcome == {"job_succeeded": 1}
    assert keyed.left_after_stop([second], keyed.name(workload.effect)) == 0
    assert effects(store, prefix, "k5") == 1
    assert starts(store, prefix, "k5") == 2  # the killed attempt and the one that completed


def test_bulk_send_drops_duplicates_and_names_the_originals(keyed, state_url):
    first = [keyed.message(workload.effect, f"b{i}") for i in range(100)]
    send_bulk(first, broker=keyed.broker)
    again = [keyed.message(workload.effect, f"b{i}") for i in range(90, 110)]
    result = send_bulk(again, broker=keyed.broker)
    originals = {m.message_id for m in first}
    assert [m.message_id in originals for m in result] == [True] * 10 + [False] * 10
    assert keyed.depth(keyed.name(workload.effect)) == 110


def test_a_failed_bulk_send_gives_back_the_keys_of_the_messages_not_confirmed(keyed, state_url):
    """RabbitMQ refuses 15 of 20: the sender's retry with new messages carrying the same keys
    finds the 5 confirmed as duplicates and publishes the 15 others."""
    queue = keyed.name(workload.effect)
    keyed.broker.declare_queue(queue, ensure=True)
    first = [keyed.message(workload.effect, f"f{i}") for i in range(20)]
    with keyed.capped(queue, 5), pytest.raises(BulkSendError):
        send_bulk(first, broker=keyed.broker)
    again = [keyed.message(workload.effect, f"f{i}") for i in range(20)]
    result = send_bulk(again, broker=keyed.broker)
    assert [m.options.get("duplicate", False) for m in result] == [True] * 5 + [False] * 15
    assert [m.message_id for m in result[:5]] == [m.message_id for m in first[:5]]
    assert keyed.depth(queue) == 20


def test_an_interrupted_bulk_send_gives_back_only_the_keys_of_the_messages_not_confirmed(keyed, monkeypatch):
    """Ctrl-C (or an actor's time limit) once RabbitMQ confirmed 5 of 20: the interrupt goes on, and
    the sender's retry with new messages carrying the same keys finds the 5 as duplicates and
    publishes the 15 others."""
    on_confirm = Publisher._on_confirm

    def interrupted(publisher: Publisher, frame: pika.frame.Method) -> None:
        on_confirm(publisher, frame)
        if len(publisher.confirmed) == 5:
            raise KeyboardInterrupt

    first = [keyed.message(workload.effect, f"i{i}") for i in range(20)]
    with monkeypatch.context() as patched, pytest.raises(KeyboardInterrupt):
        patched.setattr(Publisher, "_on_confirm", interrupted)
        send_bulk(first, broker=keyed.broker, window=1)
    again = [keyed.message(workload.effect, f"i{i}") for i in range(20)]
    result = send_bulk(again, broker=keyed.broker)
    assert [m.options.get("duplicate", False) for m in result] == [True] * 5 + [False] * 15
    assert [m.message_id for m in result[:5]] == [m.message_id for m in first[:5]]


class Refused(MiddlewareError):
    pass


class RefuseOne(dramatiq.Middleware):
    """Refuses the send of the message whose first argument is ``e10``."""

    def before_enqueue(self, broker: dramatiq.Broker, message: dramatiq.Message[Any], delay: Any) -> None:
        if message.args[0] == "e10":
            raise Refused("refused")


@pytest.mark.parametrize("cause", ["refused", "unencodable", "unreachable"])
def test_a_bulk_send_that_fails_before_publishing_publishes_nothing_and_gives_every_key_back(
    keyed, state_url, monkeypatch, cause
):
    """A ``before_enqueue`` hook refusing the 11th message, an 11th message whose argument JSON
    cannot encode (raised as it is; with a window of 5, the first ones would be out by then were
    the bodies not all encoded first), a node that cannot be reached."""
    queue = keyed.name(workload.effect)
    keyed.broker.declare_queue(queue, ensure=True)
    first = [keyed.message(workload.effect, f"e{i}") for i in range(20)]
    expected: type[BaseException] = {"refused": Refused, "unencodable": TypeError}.get(cause, BulkSendError)
    with monkeypatch.context() as patched, pytest.raises(expected):
        if cause == "refused":
            patched.setattr(keyed.broker, "middleware", [*keyed.broker.middleware, RefuseOne()])
        elif cause == "unencodable":
            first[10] = keyed.message(workload.effect, "e10", seconds={0.5})
        else:
            closed = pika.ConnectionParameters(host="127.0.0.1", port=free_port(), connection_attempts=1)
            patched.setattr(keyed.broker, "parameters", [closed])
        send_bulk(first, broker=keyed.broker, window=5)
    assert keyed.depth(queue) == 0
    again = [keyed.message(workload.effect, f"e{i}") for i in range(20)]
    assert not any(m.options.get("duplicate") for m in send_bulk(again, broker=keyed.broker))
    assert keyed.depth(queue) == 20


@pytest.fixture
def private_redis(tmp_path):
    """A Redis of this test's own, so stopping it disturbs no one else."""
    port = free_port()
    command = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]

    def start() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, cwd=tmp_path)
        wait_for(lambda: _pings(port), what="redis start")
        return proc

    server = {"proc": start()}
    yield port, server, start
    server["proc"].terminate()
    server["proc"].wait(10)


def _pings(port: int) -> bool:
    try:
        return bool(redis_lib.Redis(port=port, socket_timeout=0.5).ping())
    except redis_lib.RedisError:
        return False


def test_redis_down_mid_run_runs_nothing_unguarded(start_worker, queues, store, prefix, private_redis):
    port, server, start = private_redis
    url = f"redis://127.0.0.1:{port}/0"
    worker = start_worker(threads=4, STATE_URL=url)
    keyed = queues.using(sender_broker(prefix, url))
    ids = [keyed.send(workload.effect, f"d{i}", seconds=0.5).message_id for i in range(12)]
    wait_for(lambda: sum(starts(store, prefix, f"d{i}") for i in range(12)) >= 2, what="the first starts")
    server["proc"].kill()
    server["proc"].wait(10)
    down_at = time.time()
    # The worker goes on taking messages and defers each one: wait until it has deferred several.
    # Idempotency defers the first; 3 s after the cancellation poller last heard from the store,
    # Cancellation asks the store on each arrival, before Idempotency, and defers them itself.
    # Either guard's deferral counts.
    try:
        wait_for(
            lambda: len(worker.events("job_deferred", reason="store_unavailable")) >= 4,
            what="deferrals while it is down",
        )
    except AssertionError as timed_out:  # seen once in CI: show where the worker stood
        tail = "\n".join(worker.output().splitlines()[-60:])
        raise AssertionError(f"{timed_out}; the worker's last lines:\n{tail}") from None
    # ... and once the cancellation poller's word is stale, Cancellation's own: a store that is
    # down, not a guard that failed.
    wait_for(
        lambda: worker.events("job_deferred", middleware="Cancellation", reason="store_unavailable"),
        what="a deferral by Cancellation",
    )
    assert not worker.events("guard_failed")
    up_at = time.time()
    server["proc"] = start()
    outcomes = wait_for_final_events([worker], {message_id: 1 for message_id in ids}, timeout=120)
    assert all(events == {"job_succeeded": 1} for events in outcomes.values()), outcomes
    started = [float(t) for i in range(12) for t in store.lrange(f"test:{prefix}started:d{i}", 0, -1)]
    assert not [t for t in started if down_at + 0.1 < t < up_at], "a job started while the store was down"
    queue = queues.name(workload.effect)
    assert queues.left_after_stop([worker], queue) == 0
    assert [effects(store, prefix, f"d{i}") for i in range(12)] == [1] * 12
    assert queues.depth(queue + ".DLQ") == 0
    # Every delivery, deferred or run, was the first attempt: deferrals never burn a retry.
    deliveries = [e for e in worker.events("job_started") if e.get("message_id") in ids]
    assert len(deliveries) > 12 and {e["attempt"] for e in deliveries} == {1}


def test_a_job_still_running_at_a_clean_stop_keeps_its_claim_until_it_ends(
    start_worker, keyed, store, prefix, state_url
):
    """Dramatiq lets running jobs finish at a stop (up to WORKER_SHUTDOWN_TIMEOUT_MS): their
    leases are renewed meanwhile, or a copy could run beside them once one lapsed."""
    lease_ms = 2_000
    worker = start_worker(STATE_URL=state_url, IDEMPOTENCY_LEASE_MS=str(lease_ms))
    message = keyed.send(workload.effect, "k-stop", seconds=4.0)
    wait_for(lambda: starts(store, prefix, "k-stop") == 1, what="the start")
    worker.proc.send_signal(signal.SIGTERM)
    stop_sent = time.monotonic()
    idempotency = next(m for m in keyed.broker.middleware if isinstance(m, Idempotency))
    key = idempotency.scoped(message.actor_name, "k-stop")

    def renewed_after_the_stop() -> bool:
        # A claim by another owner: "held" tells how long the holder's lease still runs.
        claim = idempotency.backend.claim(key, message.message_id, "probe", lease_ms, 60_000)
        assert claim.status == "held", claim  # not "claimed": the lease had lapsed
        return time.monotonic() + claim.wait_ms / 1000 > stop_sent + lease_ms / 1000 + 0.3

    wait_for(renewed_after_the_stop, timeout=3, interval=0.1, what="a renewal after the stop")
    worker.proc.wait(30)  # the job ends, then the worker (a second signal would mean "stop now")
    assert worker.stop() == 0
    assert effects(store, prefix, "k-stop") == 1
    record = idempotency.lookup(message.actor_name, "k-stop")
    assert record is not None and record.state == "done"


def test_a_send_whose_publish_failed_is_published_when_sent_again(
    start_worker, keyed, store, prefix, state_url, monkeypatch
):
    """The key is registered before the publish. A publish that fails gives it back, so the
    sender's retry (a new message) is published, not dropped as a duplicate of a message RabbitMQ
    never had."""
    worker = start_worker(STATE_URL=state_url)

    def lost(*args: object, **kwargs: object) -> None:
        raise pika.exceptions.AMQPConnectionError("connection lost while publishing")

    with monkeypatch.context() as patched:
        patched.setattr(BlockingChannel, "basic_publish", lost)
        with pytest.raises(ConnectionClosed):
            keyed.send(workload.effect, "k-unsent")
    again = keyed.send(workload.effect, "k-unsent")
    assert again.options.get("duplicate") is not True
    (record,) = keyed.wait_finished([again]).values()
    assert record.state == "succeeded" and effects(store, prefix, "k-unsent") == 1
    assert keyed.left_after_stop([worker], keyed.name(workload.effect)) == 0


def test_a_claim_sent_ahead_goes_stale_and_is_renewed_by_its_own_owner(
    start_worker, keyed, store, prefix, state_url
):
    """Claims are sent as messages arrive; one that waited behind a slow job still holds its lease
    (or is made again at start by the same owner), so the message runs at once instead of finding
    its own claim 'held'."""
    worker = start_worker(threads=1, STATE_URL=state_url)
    slow = keyed.send(workload.effect, "slow", seconds=1.0)
    behind = keyed.send(workload.effect, "behind")
    outcomes = wait_for_final_events([worker], {slow.message_id: 1, behind.message_id: 1})
    assert all(events == {"job_succeeded": 1} for events in outcomes.values()), outcomes
    assert effects(store, prefix, "slow") == 1 and starts(store, prefix, "behind") == 1
    assert not worker.events("duplicate_deferred")  # the log is complete up to the final events
