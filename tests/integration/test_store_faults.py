"""The guarantees when the state store answers errors instead of refusing connections, when user
callables raise, and across a clean restart: real workers, real RabbitMQ, a private Redis server
the tests break on purpose (out of memory, read-only replica, wrong database index)."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis as redis_lib

from middleware.idempotency import IdempotencyKeyError, IdempotencyStoreError
from tests import workload
from tests.integration.test_ratelimit import assert_conforms, limits, starts
from tests.senders import sender_broker
from tests.servers import free_port
from tests.support import run_worker, wait_for
from tests.workers import wait_for_final_events


class PrivateRedis:
    """A ``redis-server`` of the test's own, to break: out of memory, read-only, then healed;
    ``options`` go on its command line (``--dir PATH``), ``password`` is its ``requirepass``."""

    def __init__(self, *options: str, password: str | None = None) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                *options,
                *(["--requirepass", password] if password else []),
            ],
            stdout=subprocess.DEVNULL,
        )
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.client = redis_lib.Redis.from_url(self.url, password=password)
        wait_for(self._answers, timeout=10, what="the private redis")

    def _answers(self) -> bool:
        try:
            return bool(self.client.ping())
        except redis_lib.ConnectionError:
            return False

    def break_(self, fault: str) -> None:
        """``oom``: every write answers OOM; ``readonly``: every write answers READONLY."""
        if fault == "oom":
            self.client.config_set("maxmemory", 1)
        else:  # a replica of a master that is not there: read-only, its data kept
            self.client.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))  # type: ignore[no-untyped-call]

    def heal(self) -> None:
        self.client.config_set("maxmemory", 0)
        self.client.execute_command("REPLICAOF", "NO", "ONE")  # type: ignore[no-untyped-call]

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    server = PrivateRedis()
    yield server
    server.stop()


def events(output: str, name: str, **fields: Any) -> list[dict[str, Any]]:
    """The worker's JSON log lines for event ``name`` whose fields include ``fields``."""
    found = []
    for line in output.splitlines():
        if f'"{name}"' not in line or not line.startswith("{"):
            continue
        event = json.loads(line)
        if event.get("event") == name and all(event.get(k) == v for k, v in fields.items()):
            found.append(event)
    return found


def counter(store: redis_lib.Redis, prefix: str, kind: str) -> Callable[[str], int]:
    return lambda token: int(store.llen(f"test:{prefix}{kind}:{token}"))


@pytest.mark.parametrize("fault", ["oom", "readonly"])
def test_store_error_replies_fail_closed(start_worker, queues, store, prefix, private_redis, fault):
    """Redis answering errors: nothing runs, a keyed send raises; once healed the key runs once
    and the bucket holds."""
    worker = start_worker(
        threads=4, STATE_URL=private_redis.url, RATE_LIMITS=limits(api={"rate": 2, "burst": 2})
    )
    wait_for(lambda: events(worker.output(), "state_store_ready"), what="the store check")
    sender = queues.using(sender_broker(prefix, private_redis.url))
    private_redis.break_(fault)

    with pytest.raises(IdempotencyStoreError):
        sender.send(workload.effect, "during-outage")
    keyed = sender.message(workload.effect, "once")
    sender.publish_raw(keyed, copies=8)  # eight deliveries of one key, past the send-side check
    limited = [sender.message(workload.limited, f"l{i}", "api") for i in range(16)]
    for message in limited:
        sender.publish_raw(message)

    # Each of the 17 distinct messages reached its guard and was deferred, and none ran.
    ids = {keyed.message_id} | {m.message_id for m in limited}
    wait_for(
        lambda: {e["message_id"] for e in events(worker.output(), "job_deferred")} >= ids,
        timeout=30,
        what="every message deferred",
    )
    effects = counter(store, prefix, "effect")
    assert effects("once") == 0 and effects("during-outage") == 0
    assert store.llen(f"test:{prefix}starts") == 0
    assert events(worker.output(), "guard_failed") == []  # the contract mapped every error reply

    private_redis.heal()
    # Every delivery ends: the keyed copies in one run and seven skips, each limited job in a run.
    deliveries = {keyed.message_id: 8, **{m.message_id: 1 for m in limited}}
    outcomes = wait_for_final_events([worker], deliveries, timeout=90)
    assert outcomes.pop(keyed.message_id) == {"job_succeeded": 1, "duplicate_skipped": 7}
    assert all(events == {"job_succeeded": 1} for events in outcomes.values()), outcomes
    assert effects("once") == 1
    notes = starts(store, prefix)
    assert sorted(n["token"] for n in notes) == sorted(f"l{i}" for i in range(16))
    assert_conforms([n["t"] for n in notes], rate=2, burst=2)


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:6379/99", "redis://jobs:s3cret-pw@127.0.0.1:6379/1"], ids=["db-index", "auth"]
)
def test_a_store_that_cannot_serve_stops_the_worker(prefix, tmp_path, url):
    done = run_worker(prefix, tmp_path, processes=2, STATE_URL=url)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    lines = [line for line in output.splitlines() if "invalid setting STATE_URL" in line]
    assert len(lines) == 1 and "cannot serve" in lines[0], output
    assert "Traceback" not in output and "s3cret-pw" not in output


def test_an_unreachable_store_is_reported_until_it_answers(start_worker, queues, store, prefix):
    port = free_port()
    worker = start_worker(STATE_URL=f"redis://127.0.0.1:{port}/0")
    wait_for(
        lambda: len(events(worker.output(), "state_store_unavailable")) >= 2, timeout=20, what="warnings"
    )
    assert events(worker.output(), "state_store_ready") == []
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""], stdout=subprocess.DEVNULL
    )
    try:
        wait_for(lambda: events(worker.output(), "state_store_ready"), timeout=20, what="the store ready")
    finally:
        server.kill()
        server.wait(10)


def test_a_429_while_the_store_fails_loses_nothing(start_worker, queues, store, prefix, private_redis):
    """The actor says "429" just as the store starts answering OOM: the rate limiter cannot drain
    its bucket, and must still re-enqueue the job rather than let the skip path ack it."""
    worker = start_worker(STATE_URL=private_redis.url, RATE_LIMITS=limits(api={"rate": 100, "burst": 10}))
    message = queues.send(workload.breaks_store_then_429, "t429")
    wait_for(
        lambda: events(worker.output(), "job_deferred", message_id=message.message_id),
        timeout=30,
        what="the re-enqueued job deferred by the failing store",
    )
    private_redis.heal()
    outcome = wait_for_final_events([worker], {message.message_id: 1}, timeout=60)[message.message_id]
    assert outcome == {"job_succeeded": 1}
    assert counter(store, prefix, "effect")("t429") == 1


def test_user_callables_that_raise_dead_letter_the_job(start_worker, queues, store, prefix):
    worker = start_worker(RATE_LIMITS=limits(api={"rate": 100, "burst": 10}))
    with pytest.raises(IdempotencyKeyError):
        queues.send(workload.keyed_by_callable, "bad-key")  # raised to the caller, not published
    bad_key = queues.message(workload.keyed_by_callable, "bad-key")
    bad_bucket = queues.message(workload.limited_by_callable, "bad-bucket")
    good = [
        queues.message(workload.keyed_by_callable, "good"),
        queues.message(workload.limited_by_callable, "ok"),
    ]
    for message in (bad_key, bad_bucket, *good):
        queues.publish_raw(message)

    dead = queues.name(workload.keyed_by_callable) + ".DLQ"
    wait_for(lambda: len(queues.peek(dead)) == 2, timeout=30, what="two dead letters")
    headers = {m["properties"]["message_id"]: m["properties"]["headers"] for m in queues.peek(dead)}
    for message, exception in ((bad_key, "IdempotencyKeyError"), (bad_bucket, "ValueError")):
        assert headers[message.message_id]["x-dl-reason"] == "rejected"
        assert headers[message.message_id]["x-dl-exception"] == exception
        assert "no key for" in headers[message.message_id]["x-dl-error"] or exception == "ValueError"
    effects = counter(store, prefix, "effect")
    wait_for(lambda: effects("good") == 1 and effects("ok") == 1, what="the good jobs")
    assert effects("bad-key") == 0 and effects("bad-bucket") == 0
    assert events(worker.output(), "guard_failed") == []


def test_sigterm_gives_back_the_claims_of_prefetched_jobs(start_worker, queues, store, prefix):
    """A clean stop with keyed jobs prefetched: after a restart they run at once, without waiting
    out the stopped worker's leases."""
    first = start_worker(threads=2, IDEMPOTENCY_LEASE_MS="60000")
    tokens = [f"p{i}" for i in range(16)]
    for token in tokens:
        queues.send(workload.effect, token, seconds=0.3)
    started = counter(store, prefix, "started")
    wait_for(lambda: sum(started(t) for t in tokens) >= 2, what="the first jobs")
    assert first.stop(signal.SIGTERM) == 0
    released = events(first.output(), "claims_released")
    assert released and released[0]["claims"] >= 1

    second = start_worker(threads=4, IDEMPOTENCY_LEASE_MS="60000")
    effects = counter(store, prefix, "effect")
    wait_for(lambda: all(effects(t) == 1 for t in tokens), timeout=40, what="every job once")
    assert events(second.output(), "duplicate_deferred") == []  # no key was still leased
