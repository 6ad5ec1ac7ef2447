"""Actors used only by the tests: each records what happened to it in Redis, where the test reads it.

The worker under test imports them with ``dramatiq actors tests.workload``. The per-test
``QUEUE_PREFIX`` keeps every test on queues of its own; the Redis keys carry the same prefix.
"""

from __future__ import annotations

import json
import os
import time

import dramatiq
import redis
from dramatiq.middleware import CurrentMessage

from actors import settings
from middleware.ratelimit import RateLimited

store = redis.Redis.from_url(os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15"))
QUEUE = settings.queue("workload")


class Permanent(Exception):
    """A failure no retry can fix."""


def key(name: str) -> str:
    """A Redis key of the current test (the prefix is the test's ``QUEUE_PREFIX``)."""
    return f"test:{settings.queue_prefix}{name}"


def _note(kind: str, token: str) -> None:
    store.rpush(key(f"{kind}:{token}"), f"{time.time():.6f}")
    store.incr(key(f"count:{kind}"))


@dramatiq.actor(queue_name=QUEUE)
def record(token: str) -> None:
    """Succeed, noting the run."""
    store.sadd(key("tokens"), token)
    store.incr(key("count:record"))


@dramatiq.actor(queue_name=QUEUE)
def flaky(token: str, failures: int) -> int:
    """Fail ``failures`` times, then succeed; every attempt is noted."""
    _note("attempt", token)
    attempts = int(store.llen(key(f"attempt:{token}")))
    if attempts <= failures:
        raise RuntimeError(f"attempt {attempts} of {token} fails on purpose")
    _note("effect", token)
    return attempts


@dramatiq.actor(queue_name=QUEUE, throws=(Permanent,))
def permanent(token: str) -> None:
    """Fail once, for good."""
    _note("attempt", token)
    raise Permanent("this cannot succeed")


@dramatiq.actor(queue_name=QUEUE)
def slow(token: str, seconds: float) -> None:
    """Note the start, work for ``seconds``, note the end."""
    _note("started", token)
    time.sleep(seconds)
    _note("finished", token)


@dramatiq.actor(queue_name=QUEUE, idempotency_key=lambda token, seconds=0.0, failures=0: token)
def effect(token: str, seconds: float = 0.0, failures: int = 0) -> str:
    """A keyed job with an effect that must happen once: note the start, work, fail
    ``failures`` times, then note the effect."""
    _note("started", token)
    time.sleep(seconds)
    if int(store.llen(key(f"started:{token}"))) <= failures:
        raise RuntimeError("failing on purpose")
    _note("effect", token)
    return f"done {token}"


@dramatiq.actor(queue_name=QUEUE, rate_limit=lambda token, bucket, **kw: bucket)
def limited(token: str, bucket: str, upstream_429: float = 0.0) -> None:
    """Spend a token of ``bucket`` (``service`` or ``service:tenant``) and note the start: time,
    retries, message id. With ``upstream_429``, the first attempt answers like an API saying
    "429, retry after that many seconds"."""
    started = time.time()
    message = CurrentMessage.get_current_message()
    assert message is not None
    note = {"t": started, "token": token, "bucket": bucket, "id": message.message_id}
    store.rpush(key("starts"), json.dumps({**note, "retries": message.options.get("retries", 0)}))
    if upstream_429 and store.incr(key(f"429:{token}")) == 1:
        raise RateLimited(retry_after=upstream_429)
