"""Helpers of the delay tests: RabbitMQ's consumer_timeout set for a test, what waits in a test's
delay cascade, and what workers hold unacked."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import dramatiq
import pika
import requests

from jobsystem.rabbitmq.delays import DelayCascade, seconds_of
from jobsystem.settings import load_settings
from jobsystem.system import build_system, get_system
from tests.queues import Queues
from tests.support import TEST_REDIS_URL, wait_for


def _rabbitmqctl_eval(expression: str) -> str:
    done = subprocess.run(
        ["rabbitmqctl", "eval", expression], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout.strip()


@contextlib.contextmanager
def consumer_timeout(ms: int) -> Iterator[None]:
    """RabbitMQ's ``consumer_timeout`` set to ``ms`` (it applies to channels opened afterwards),
    the previous value restored after. RabbitMQ 3.10 has no per-queue ``x-consumer-timeout``."""
    before = _rabbitmqctl_eval("application:get_env(rabbit, consumer_timeout).")
    _rabbitmqctl_eval(f"application:set_env(rabbit, consumer_timeout, {ms}).")
    try:
        yield
    finally:
        found = re.fullmatch(r"\{ok,(\d+)\}", before)
        if found:
            _rabbitmqctl_eval(f"application:set_env(rabbit, consumer_timeout, {found.group(1)}).")
        else:
            _rabbitmqctl_eval("application:unset_env(rabbit, consumer_timeout).")


@contextlib.contextmanager
def refusing_cascade(queues: Queues) -> Iterator[None]:
    """Every level queue of the test's cascade full and refusing publishes (a RabbitMQ policy)."""
    vhost = quote(queues.settings.rabbitmq_vhost, safe="")
    url = f"{queues.settings.management_url}/api/policies/{vhost}/{quote(queues.prefix, safe='')}-refuse"
    policy = {
        "pattern": f"^{re.escape(queues.prefix)}delay\\.L[0-9]+$",
        "definition": {"max-length": 0, "overflow": "reject-publish"},
        "apply-to": "queues",
        "priority": 10,
    }
    requests.put(url, json=policy, auth=queues.auth, timeout=10).raise_for_status()
    try:
        level = DelayCascade(queues.prefix).level(6)
        wait_for(
            lambda: queues.info(level).get("effective_policy_definition", {}).get("max-length") == 0,
            timeout=15,
            what="the policy to apply",
        )
        yield
    finally:
        requests.delete(url, auth=queues.auth, timeout=10)


def in_cascade(prefix: str) -> dict[str, int]:
    """The messages waiting in each level queue of the test's delay cascade that holds any
    (passive declares: exact and current)."""
    connection = pika.BlockingConnection(pika.URLParameters(get_system().settings.rabbitmq_url.split(";")[0]))
    try:
        channel = connection.channel()
        counts = {
            name: int(channel.queue_declare(name, passive=True).method.message_count)
            for name in DelayCascade(prefix).queues()
        }
    finally:
        connection.close()
    return {name: count for name, count in counts.items() if count}


def cascade_contents(queues: Queues) -> list[dict[str, Any]]:
    """Each message waiting in the cascade, peeked (requeued): its level queue, the seconds left
    in its routing key when it entered that level, its body's options and its AMQP priority."""
    found = []
    for name in DelayCascade(queues.prefix).queues():
        for peeked in queues.peek(name):
            found.append({"queue": name, "seconds": seconds_of(peeked["routing_key"]), **peeked})
    return found


def unacked(queues: Queues, queue: str) -> int:
    """Deliveries of ``queue`` and its ``.DQ`` that consumers hold unacked (management API sample)."""
    return sum(int(queues.info(name).get("messages_unacknowledged", 0)) for name in (queue, queue + ".DQ"))


def send_delayed(
    queues: Queues, actor: dramatiq.Actor[Any, Any], delay_ms: int, *args: Any, **options: Any
) -> dramatiq.Message[Any]:
    """Send ``actor(*args)`` to the test's queue with ``delay_ms``, as ``send_with_options`` does."""
    message = queues.message(actor, *args)
    if options:
        message = message.copy(options=options)
    result: dramatiq.Message[Any] = queues.broker.enqueue(message, delay=delay_ms)
    return result


def short_horizon(queues: Queues, prefix: str) -> Queues:
    """The test's queues, sent to through a broker whose horizon is two seconds."""
    settings = load_settings(
        {**os.environ, "QUEUE_PREFIX": prefix, "STATE_URL": TEST_REDIS_URL, "DELAY_HORIZON_MS": "2000"}
    )
    broker = build_system(settings).broker
    broker.actors.update(get_system().broker.actors)
    return queues.using(broker)


def wait_seconds(until_s: float) -> None:
    """Sleep until ``time.time()`` reaches ``until_s`` (no-op when past)."""
    time.sleep(max(0.0, until_s - time.time()))
