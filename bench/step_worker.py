"""A latency-probe worker that notes when each step of a probe's way through it began and ended.

``dramatiq bench.step_worker`` imports the bench's bare worker or the project's (``BENCH_STACK``:
``bare`` or ``project``) and wraps, in this process only, the steps ``bench.latency_steps`` reports:
the consumer's (the delivery read, decoded, its receive hooks run, handed over) and each
middleware's ``before_process_message``. When a probe's actor starts, the marks noted since the
probe was sent are pushed, as one JSON record, to the Redis list ``BENCH_STEPS_KEY``. Each mark
holds the thread CPU time the step took as well as its wall-clock times: a step that took longer
than its CPU time waited (for a reply, for the GIL, for a core).

Each mark costs four clock reads and a call (a few µs), so a traced probe is a little slower than
an untraced one: the steps say where the time goes, ``bench.latency`` how much there is.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable
from typing import Any

import redis
from dramatiq import Actor, Broker, get_broker
from dramatiq.middleware import Middleware

__all__ = ["MARKS", "Mark", "install"]

#: ``(step, began, ended, cpu)``: wall-clock seconds (the sender's clock: same host), and the CPU
#: seconds of its thread the step took.
Mark = tuple[str, float, float, float]
#: The marks noted since the last probe started (appended by any thread: atomic under the GIL).
MARKS: list[Mark] = []

#: The consumer's steps, by the method that ends each one (those a consumer class defines are
#: marked): a call of the first three that returns None (an idle poll, a delivery the consumer
#: settled itself) is not a step of a probe's way.
_CONSUMER_STEPS = {
    "_next_delivery": "delivery read (pika)",
    "_checked": "delivery decoded and checked",
    "__next__": "handed to the consumer thread",
    "_received": "receive hooks (claims sent)",
}


def _marked(step: str, call: Callable[..., Any], *, none_counts: bool = True) -> Callable[..., Any]:
    """``call``, noting a mark for ``step`` each time it returns (unless it returns None and
    ``none_counts`` is false)."""

    @functools.wraps(call)
    def marked(*args: Any, **kwargs: Any) -> Any:
        began, cpu = time.time(), time.thread_time()
        result = call(*args, **kwargs)
        if none_counts or result is not None:
            MARKS.append((step, began, time.time(), time.thread_time() - cpu))
        return result

    return marked


def _mark_consumer(consumer_class: type) -> None:
    for method, step in _CONSUMER_STEPS.items():
        if method in vars(consumer_class):
            call = getattr(consumer_class, method)
            setattr(consumer_class, method, _marked(step, call, none_counts=method == "_received"))


def _mark_hooks(broker: Broker) -> None:
    """Wrap each middleware's own ``before_process_message`` (not the base class's empty one)."""
    for middleware in broker.middleware:
        hook = type(middleware).before_process_message
        if hook is not Middleware.before_process_message:
            step = f"{type(middleware).__name__}.before_process_message"
            middleware.before_process_message = _marked(step, middleware.before_process_message)  # type: ignore[method-assign]


def _push_marks(actor: Actor[Any, Any], steps_key: str, client: redis.Redis) -> None:
    """Make ``actor`` (a latency probe) push, once it has run, the marks noted since it was sent."""
    probe = actor.fn

    def traced(sent_at: float, key: str) -> None:
        started = time.time()
        marks = [mark for mark in MARKS if mark[2] >= sent_at]
        MARKS.clear()
        probe(sent_at, key)
        record = {"key": key, "sent": sent_at, "started": started, "marks": marks}
        client.rpush(steps_key, json.dumps(record))

    actor.fn = traced


def install(stack: str, steps_key: str, redis_url: str) -> None:
    """Import ``stack``'s worker (``bare`` or ``project``) and mark its steps."""
    if stack == "bare":
        from dramatiq.brokers.rabbitmq import _RabbitmqConsumer

        import bench.bare as module

        consumer_class: type = _RabbitmqConsumer
    elif stack == "project":
        import bench.project as module  # type: ignore[no-redef]
        from jobsystem.rabbitmq.consumer import DeadLetteringConsumer

        consumer_class = DeadLetteringConsumer
    else:
        raise ValueError(f"BENCH_STACK must be bare or project, not {stack!r}")
    _mark_consumer(consumer_class)
    _mark_hooks(get_broker())
    _push_marks(module.latency_probe, steps_key, redis.Redis.from_url(redis_url))


if os.environ.get("BENCH_STACK"):
    install(
        os.environ["BENCH_STACK"],
        os.environ["BENCH_STEPS_KEY"],
        os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14"),
    )
