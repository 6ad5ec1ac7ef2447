"""Idempotency keys end to end: real workers, real RabbitMQ, each state store backend."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
import redis as redis_lib

from actors.bulk import send_bulk
from tests import workload
from tests.support import free_port, sender_broker, wait_for


@pytest.fixture
def keyed(queues, prefix, state_url):
    """The test's queues, sending through a broker whose middleware uses ``state_url``."""
    return queues.using(sender_broker(prefix, state_url))


def effects(store, prefix, token):
    return store.llen(f"test:{prefix}effect:{token}")


def starts(store, prefix, token):
    return store.llen(f"test:{prefix}started:{token}")


def test_three_sends_with_one_key_run_once(start_worker, keyed, store, prefix, state_url):
    worker = start_worker(STATE_URL=state_url)
    sent = [keyed.send(workload.effect, "k1") for _ in range(3)]
    assert {m.message_id for m in sent} == {sent[0].message_id}
    assert [m.options.get("duplicate", False) for m in sent] == [False, True, True]
    wait_for(lambda: effects(store, prefix, "k1") == 1, what="the run")
    # An explicit message option key works the same, for an actor without a key function.
    for _ in range(3):
        keyed.send_with_options(workload.record, args=("r1",), idempotency_key="order-42")
    wait_for(lambda: store.get(f"test:{prefix}count:record") == "1", what="the keyed record")
    time.sleep(1.0)
    assert effects(store, prefix, "k1") == 1 and store.get(f"test:{prefix}count:record") == "1"
    if state_url.startswith("sqlite"):
        assert "state_store_single_host" in worker.output()


def test_the_same_message_delivered_twice_runs_once(start_worker, keyed, store, prefix, state_url):
    start_worker(STATE_URL=state_url)
    message = keyed.send(workload.effect, "k2")
    keyed.publish_raw(message)  # the copy RabbitMQ would redeliver, or a client that sent twice
    wait_for(lambda: effects(store, prefix, "k2") == 1, what="the run")
    queue = keyed.name(workload.effect)
    wait_for(lambda: keyed.depth(queue) == 0 and keyed.depth(queue + ".DQ") == 0, what="both copies handled")
    assert effects(store, prefix, "k2") == 1 and starts(store, prefix, "k2") == 1


def test_two_workers_racing_on_duplicates_run_once(start_worker, keyed, store, prefix, state_url):
    start_worker(processes=1, threads=4, STATE_URL=state_url)
    start_worker(processes=1, threads=4, STATE_URL=state_url)
    message = keyed.message(workload.effect, "k3", seconds=1.0)
    keyed.publish_raw(message, copies=12)
    wait_for(lambda: effects(store, prefix, "k3") == 1, what="the run")
    queue = keyed.name(workload.effect)
    wait_for(
        lambda: keyed.depth(queue) == 0 and keyed.depth(queue + ".DQ") == 0, timeout=60, what="all copies"
    )
    assert effects(store, prefix, "k3") == 1 and starts(store, prefix, "k3") == 1


def test_a_job_that_fails_then_succeeds_has_its_effect_once(start_worker, keyed, store, prefix, state_url):
    start_worker(STATE_URL=state_url, JOB_MIN_BACKOFF_MS="100")
    keyed.send(workload.effect, "k4", failures=2)
    wait_for(lambda: effects(store, prefix, "k4") == 1, what="the run")
    assert starts(store, prefix, "k4") == 3
    # A later duplicate send finds the key completed: dropped at send, nothing runs.
    assert keyed.send(workload.effect, "k4").options.get("duplicate") is True
    time.sleep(0.5)
    assert starts(store, prefix, "k4") == 3


def test_sigkill_of_the_claim_holder_runs_the_job_once_after_redelivery(
    start_worker, keyed, store, prefix, state_url
):
    lease = {"STATE_URL": state_url, "IDEMPOTENCY_LEASE_MS": "3000"}
    first = start_worker(**lease)
    keyed.send(workload.effect, "k5", seconds=2.0)
    wait_for(lambda: starts(store, prefix, "k5") == 1, what="the first start")
    first.kill()
    first.proc.wait(10)
    start_worker(**lease)
    wait_for(lambda: effects(store, prefix, "k5") == 1, timeout=60, what="the run after redelivery")
    time.sleep(1.0)
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


@pytest.fixture
def private_redis(tmp_path):
    """A Redis of this test's own, so stopping it disturbs no one else."""
    port = free_port()
    command = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]

    def start() -> subprocess.Popen:
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
    for i in range(12):
        keyed.send(workload.effect, f"d{i}", seconds=0.5)
    wait_for(lambda: sum(starts(store, prefix, f"d{i}") for i in range(12)) >= 2, what="the first starts")
    server["proc"].kill()
    server["proc"].wait(10)
    down_at = time.time()
    time.sleep(3.0)  # the worker now defers every message it takes: none may start
    up_at = time.time()
    server["proc"] = start()
    wait_for(
        lambda: all(effects(store, prefix, f"d{i}") >= 1 for i in range(12)), timeout=120, what="all effects"
    )
    started = [float(t) for i in range(12) for t in store.lrange(f"test:{prefix}started:d{i}", 0, -1)]
    assert not [t for t in started if down_at + 0.1 < t < up_at], "a job started while the store was down"
    assert [effects(store, prefix, f"d{i}") for i in range(12)] == [1] * 12
    queue = queues.name(workload.effect)
    assert queues.depth(queue + ".DLQ") == 0
    assert "idempotency_store_unavailable" in worker.output()
    for body in (json.loads(m["payload"]) for m in queues.peek(queue + ".DQ")):
        assert body["options"].get("retries", 0) == 0  # deferrals never burn a retry


def test_a_claim_sent_ahead_goes_stale_and_is_renewed_by_its_own_owner(
    start_worker, keyed, store, prefix, state_url
):
    """Claims are sent as messages arrive; one that waited behind a slow job is made again at start
    by the same owner, so the message runs at once instead of finding its own claim 'held'."""
    worker = start_worker(threads=1, STATE_URL=state_url)
    keyed.send(workload.effect, "slow", seconds=1.0)
    keyed.send(workload.effect, "behind")
    wait_for(lambda: effects(store, prefix, "behind") == 1, what="the message that waited")
    assert effects(store, prefix, "slow") == 1 and starts(store, prefix, "behind") == 1
    assert "duplicate_deferred" not in worker.output()
