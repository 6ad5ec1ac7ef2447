"""Poison messages: bodies that are not well-formed messages are dead-lettered once, as they came,
with reason ``malformed``; no worker thread dies of them, and the jobs behind them run. A thread
that dies anyway (a fault injected by ``tests.workload.KillThreadFlagged``) is replaced.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from collections import Counter
from collections.abc import Callable
from typing import Any

import pika

from jobsystem.system import get_system
from tests import workload
from tests.queues import Queues
from tests.support import BIN, ROOT, wait_for


def valid_body(queue: str, token: str) -> dict[str, Any]:
    """A well-formed ``record`` message as Dramatiq would encode it."""
    message = workload.record.message(token).copy(queue_name=queue)
    return {**message.asdict(), "args": [token]}


def _without(body: dict[str, Any], field: str) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != field}


def _with_options(body: dict[str, Any], **options: Any) -> dict[str, Any]:
    return {**body, "options": {**body["options"], **options}}


#: Each poison shape of issue 12: name -> (the body, from a valid one; the field the record names).
POISON: dict[str, tuple[Callable[[dict[str, Any]], Any], str]] = {
    "options_null": (lambda b: {**b, "options": None}, "options"),
    "queue_of_its_delay_queue": (lambda b: {**b, "queue_name": b["queue_name"] + ".DQ"}, "queue_name"),
    "queue_unknown": (lambda b: {**b, "queue_name": "elsewhere"}, "queue_name"),
    "queue_not_a_string": (lambda b: {**b, "queue_name": 7}, "queue_name"),
    "timestamp_string": (lambda b: {**b, "message_timestamp": "2026-01-01T00:00:00Z"}, "message_timestamp"),
    "timestamp_null": (lambda b: {**b, "message_timestamp": None}, "message_timestamp"),
    "message_id_integer": (lambda b: {**b, "message_id": 12345}, "message_id"),
    "message_id_missing": (lambda b: _without(b, "message_id"), "message_id"),
    "retries_string": (lambda b: _with_options(b, retries="3"), "options.retries"),
    "retries_float": (lambda b: _with_options(b, retries=1.5), "options.retries"),
    "retries_negative": (lambda b: _with_options(b, retries=-1), "options.retries"),
    "eta_string": (lambda b: _with_options(b, eta="soon"), "options.eta"),
    "throws_in_message": (lambda b: _with_options(b, throws="ValueError"), "options.throws"),
    "args_object": (lambda b: {**b, "args": {"token": "x"}}, "args"),
    "args_string": (lambda b: {**b, "args": "token"}, "args"),
    "kwargs_array": (lambda b: {**b, "kwargs": ["token"]}, "kwargs"),
    "kwargs_null": (lambda b: {**b, "kwargs": None}, "kwargs"),
    "actor_name_integer": (lambda b: {**b, "actor_name": 3}, "actor_name"),
    "actor_name_null": (lambda b: {**b, "actor_name": None}, "actor_name"),
    "actor_name_array": (lambda b: {**b, "actor_name": ["record"]}, "actor_name"),
    "unexpected_field": (lambda b: {**b, "priority": 1}, "body"),
    "json_array": (lambda b: [b], "body"),
    "json_string": (lambda b: "ana.lopez@example.com", "body"),
}


def publish(queue: str, body: bytes, message_id: str | None = None) -> None:
    get_system().broker.channel.basic_publish(
        "", queue, body, pika.BasicProperties(delivery_mode=2, message_id=message_id, content_type="x/y")
    )


def payload(letter: dict[str, Any]) -> bytes:
    """A dead letter's body as the management API returns it, as bytes."""
    if letter["payload_encoding"] == "base64":
        return base64.b64decode(letter["payload"])
    return str(letter["payload"]).encode()


def jobctl(prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "QUEUE_PREFIX": prefix, "LOG_LEVEL": "WARNING"}
    return subprocess.run(
        [str(BIN / "jobctl"), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def assert_all_threads_alive(queues: Queues, store: Any, prefix: str, threads: int) -> None:
    """``threads`` slow jobs run at the same time: every worker thread is alive and taking work."""
    for i in range(threads):
        queues.send(workload.slow, f"alive-{i}", seconds=1.5)
    wait_for(
        lambda: all(store.llen(f"test:{prefix}finished:alive-{i}") for i in range(threads)),
        what="the slow jobs",
    )
    started = [float(store.lindex(f"test:{prefix}started:alive-{i}", 0)) for i in range(threads)]
    finished = [float(store.lindex(f"test:{prefix}finished:alive-{i}", 0)) for i in range(threads)]
    assert max(started) < min(finished), "the slow jobs did not all run at once"


def test_each_poison_shape_is_dead_lettered_once_and_the_jobs_behind_it_run(
    start_worker, queues, store, prefix
):
    queue = queues.name(workload.record)
    queues.broker.declare_queue(queue, ensure=True)  # so that no body sent below is unroutable
    worker = start_worker(threads=4)
    sent: dict[str, bytes] = {}
    for name, (make, _) in POISON.items():
        sent[name] = json.dumps(make(valid_body(queue, f"poison-{name}"))).encode()
        publish(queue, sent[name], f"poison-{name}")
    sent["not_json"] = b"\xff\xfe not json \x00"
    publish(queue, sent["not_json"], "poison-not_json")
    sent["no_amqp_id"] = json.dumps({**valid_body(queue, "x"), "message_id": None}).encode()
    publish(queue, sent["no_amqp_id"])  # no id anywhere: the dead letter gets one from the body's hash
    on_delay_queue = json.dumps({**valid_body(queue, "d"), "options": {"eta": 0}}).encode()
    publish(queue + ".DQ", on_delay_queue, "poison-on_delay_queue")  # its queue_name is not the DQ's
    for i in range(10):
        publish(queue, json.dumps(valid_body(queue, f"valid-{i}")).encode())

    dead = queue + ".DLQ"
    wait_for(lambda: store.scard(f"test:{prefix}tokens") == 10, timeout=60, what="the 10 valid jobs")
    wait_for(lambda: queues.depth(dead) == len(sent) + 1, timeout=60, what="every poison dead-lettered")

    letters = queues.peek(dead, count=200)
    by_id = Counter(letter["properties"]["message_id"] for letter in letters)
    assert all(count == 1 for count in by_id.values()), by_id
    for letter in letters:
        headers = letter["properties"]["headers"]
        assert headers["x-dl-reason"] == "malformed" and headers["x-dl-queue"] == queue
        assert headers["x-dl-exception"] == "MalformedMessage" and headers["x-dl-attempts"] == 0
        assert letter["properties"]["content_type"] == "x/y"  # the original's properties are kept
    found = {letter["properties"]["message_id"]: letter for letter in letters}
    for name, (_, field) in POISON.items():
        headers = found[f"poison-{name}"]["properties"]["headers"]
        assert headers["x-dl-field"] == field, (name, headers)
        assert headers["x-dl-error"].startswith(f"{field}: "), (name, headers)
        assert payload(found[f"poison-{name}"]) == sent[name]  # byte for byte
    assert payload(found["poison-not_json"]) == sent["not_json"]
    assert found["poison-on_delay_queue"]["properties"]["headers"]["x-dl-field"] == "queue_name"
    (hashed,) = [letter for letter in letters if letter["properties"]["message_id"].startswith("malformed-")]
    assert payload(hashed) == sent["no_amqp_id"]
    # Never a value in a header: the e-mail address sent as a whole body stays in the body only.
    assert "ana.lopez" not in json.dumps([letter["properties"] for letter in letters])

    # Each was logged once (no loop), and no thread died or was restarted on the way.
    assert len(worker.events("message_malformed")) == len(sent) + 1
    assert not worker.events("worker_thread_replaced") and not worker.events("uncaught_exception")
    assert "Consumer encountered" not in worker.output()
    assert_all_threads_alive(queues, store, prefix, threads=4)

    listed = [json.loads(line) for line in jobctl(prefix, "dlq", "list", "--json").stdout.splitlines()]
    assert len(listed) == len(sent) + 1 and {d["reason"] for d in listed} == {"malformed"}
    retried = jobctl(prefix, "dlq", "retry", "--all").stdout
    total = len(sent) + 1
    assert f"retried 0 of {total} matching" in retried and f"{total} malformed, not replayed" in retried
    assert queues.depth(dead) == total


def test_a_thread_that_dies_anyway_is_replaced_and_the_jobs_behind_it_run(
    start_worker, queues, store, prefix
):
    worker = start_worker(threads=2)
    for i in range(4):  # twice as many kills as threads: without replacements none would be left
        queues.send_with_options(workload.record, args=(f"killer-{i}",), kill_thread="worker")
    late = workload.record.message_with_options(args=("late",), kill_thread="consumer")
    queues.broker.enqueue(late.copy(queue_name=queues.name(workload.record)), delay=200)
    wait_for(lambda: len(worker.events("worker_thread_replaced")) == 5, timeout=60, what="5 replacements")
    for i in range(10):
        queues.send(workload.record, f"after-{i}")

    wait_for(lambda: store.scard(f"test:{prefix}tokens") == 15, timeout=60, what="every job")
    replaced = worker.events("worker_thread_replaced")
    assert sorted(line["kind"] for line in replaced) == ["consumer"] + ["worker"] * 4
    assert all(line["level"] == "error" for line in replaced)
    assert_all_threads_alive(queues, store, prefix, threads=2)
