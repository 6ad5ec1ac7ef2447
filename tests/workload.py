"""Actors used only by the tests: each records what happened to it in Redis, where the test reads it.

The worker under test imports them with ``dramatiq actors tests.workload``. The per-test
``QUEUE_PREFIX`` keeps every test on queues of its own; the Redis keys carry the same prefix.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from typing import Any

import dramatiq
import redis
import structlog
from dramatiq.broker import MessageProxy
from dramatiq.middleware import AsyncIO, CurrentMessage, Middleware, SkipMessage

import actors  # noqa: F401 - the project's actors first, as `dramatiq actors tests.workload` has them
from jobsystem.dramatiq_internals import reject
from jobsystem.system import get_system
from middleware.ratelimit import RateLimited
from middleware.status import progress

settings = get_system().settings
if os.environ.get("TEST_LOG_BATCH_INTERVAL"):
    # A test of the log batches: lifecycle lines then leave only by size, by an ordinary line or
    # at shutdown (the flusher thread starts with the first line, after this import); Dramatiq's
    # worker keeps its INFO lines ("Shutting down...", "Worker has been shut down.") to itself,
    # so that they flush nothing.
    from jobsystem.observability import batched_stream

    for _stream in list(batched_stream._streams):
        _stream.interval = float(os.environ["TEST_LOG_BATCH_INTERVAL"])
    logging.getLogger("dramatiq.worker").setLevel(logging.WARNING)
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


@dramatiq.actor(queue_name=QUEUE)
def retry_in(token: str, delay_ms: int) -> None:
    """Ask to be retried ``delay_ms`` from now (noting the run): past the cascade's reach, a due
    time given as a delay by mistake."""
    _note("ran", token)
    raise dramatiq.Retry(delay=delay_ms)


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


# --- Personal data: actors that put it everywhere an application might (integration/test_pii_worker.py) ---

log = structlog.get_logger("tests.workload")
stdlib_log = logging.getLogger("tests.workload")


@dramatiq.actor(queue_name=QUEUE, log_args=True)
def customer_update(customer: dict[str, Any], note: str) -> None:
    """Log personal data as values, inside messages, through structlog and the standard library."""
    log.info("customer_seen", **customer)
    log.info("customer_note", note=note, customer=customer)
    log.info(f"free text event: {note}")  # data spliced into the event: the anti-pattern, on purpose
    stdlib_log.info("customer %s wrote: %s", customer, note)
    stdlib_log.warning("note with extra", extra={"email": customer["email"], "detail": note})
    try:
        raise ValueError(f"bad customer record {customer!r}: {note}")
    except ValueError:
        log.exception("customer_rejected")
        stdlib_log.exception("customer rejected: %s", note)
    store.incr(key("count:customer_update"))


def _failed_lookups(email: str, note: str, customer: dict[str, Any]) -> ExceptionGroup:
    """An exception group with personal data in its members' messages and args, and in the
    context of the exception it was raised while handling."""
    try:
        raise KeyError(email, note)
    except KeyError:
        try:
            raise ExceptionGroup("lookups failed", [ValueError(note), LookupError(email, customer)])
        except ExceptionGroup as group:
            return group


@dramatiq.actor(queue_name=QUEUE)
def leaky_failure(full_name: str, email: str, note: str, customer: dict[str, Any]) -> None:
    """Fail with personal data in the exception's message, its cause (a group whose members and
    context carry more) and the locals, until dead-lettered."""
    _note("attempt", "leaky")
    cause = _failed_lookups(email, note, customer)
    raise RuntimeError(f"could not bill full_name={full_name!r} <{email}>: {note} {customer!r}") from cause


# --- Dead letters: every way a message can end there (tests/integration/test_dead_letters.py) ---


class RejectFlagged(Middleware):
    """A middleware that rejects messages sent with ``reject=True`` (as a validating one would)."""

    def before_process_message(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        if message.kwargs.get("reject"):
            reject(message, "rejected")
            raise SkipMessage("rejected by RejectFlagged")


dramatiq.get_broker().add_middleware(RejectFlagged())


# --- Threads that die anyway: injected faults the watchdog must survive (integration/test_poison.py) ---


class ThreadKilled(BaseException):
    """What no hook may raise: a ``BaseException`` escapes Dramatiq's ``emit_after`` and ``emit_before``."""


class KillThreadFlagged(Middleware):
    """Kill the thread handling a message sent with the option ``kill_thread`` (``"worker"``: the
    worker thread, after the actor ran; ``"consumer"``: the delay queue's consumer thread, once
    per message id, as it receives the message)."""

    def __init__(self) -> None:
        self.killed_consumers: set[str] = set()

    def after_process_message(
        self, broker: dramatiq.Broker, message: MessageProxy, *, result: Any = None, exception: Any = None
    ) -> None:
        if message.options.get("kill_thread") == "worker":
            raise ThreadKilled("worker thread killed on purpose")

    def before_delay_message(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        if (
            message.options.get("kill_thread") == "consumer"
            and message.message_id not in self.killed_consumers
        ):
            self.killed_consumers.add(message.message_id)
            raise ThreadKilled("consumer thread killed on purpose")


dramatiq.get_broker().add_middleware(KillThreadFlagged())


@dramatiq.actor(queue_name=QUEUE, max_retries=0, idempotency_key=lambda token, reject=False: token)
def depends(token: str, reject: bool = False) -> None:
    """Fail while the test says its dependency is down; count the effect per token once it is up."""
    if store.exists(key("dependency-down")):
        raise ConnectionError("dependency is down")
    store.hincrby(key("effects"), token, 1)


@dramatiq.actor(queue_name=QUEUE, max_retries=0, time_limit=300)
def too_slow(seconds: float) -> None:
    """Run past its time limit, ``seconds`` at most, in slices of 50 ms: the time limit's
    interrupt (raised between bytecodes, so at the end of a slice) ends it however late its
    check comes, rather than the job ending first and succeeding."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)


@dramatiq.actor(queue_name=QUEUE)
def scheduled(token: str) -> None:
    """Note the fire time the scheduler put on the message (its ``fire_time`` option)."""
    message = CurrentMessage.get_current_message()
    store.rpush(key(f"fires:{token}"), str(message.options.get("fire_time") if message else None))


@dramatiq.actor(queue_name=QUEUE)
def staged(token: str, steps: int) -> dict[str, int]:
    """Report progress at each of ``steps`` steps, then wait there until the test lets it go on
    (key ``go:<token>:<step>``), so a poller sees every value mid-run."""
    deadline = time.monotonic() + 60
    for step in range(steps):
        progress(step / steps, note=f"step {step}")
        while not store.exists(key(f"go:{token}:{step}")) and time.monotonic() < deadline:
            time.sleep(0.02)
    return {"steps": steps}


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


# --- Faults of the state store and of user callables (tests/integration/test_store_faults.py) ---


def _key_or_raise(token: str) -> str:
    if token.startswith("bad"):
        raise ValueError(f"no key for {token}")
    return token


@dramatiq.actor(queue_name=QUEUE, idempotency_key=_key_or_raise)
def keyed_by_callable(token: str) -> None:
    """Keyed by a function that raises for tokens starting with ``bad``."""
    _note("effect", token)


def _bucket_or_raise(token: str) -> str:
    if token.startswith("bad"):
        raise ValueError(f"no bucket for {token}")
    return "api"


@dramatiq.actor(queue_name=QUEUE, rate_limit=_bucket_or_raise)
def limited_by_callable(token: str) -> None:
    """Rate limited by a function that raises for tokens starting with ``bad``."""
    _note("effect", token)


@dramatiq.actor(queue_name=QUEUE, rate_limit=lambda token: "api")  # a name the test configures
def breaks_store_then_429(token: str) -> None:
    """First attempt: make the state store answer errors (out of memory), then say "429" upstream,
    so the rate limiter must re-enqueue the job while the store refuses its writes."""
    if store.incr(key(f"429:{token}")) == 1:
        redis.Redis.from_url(os.environ["STATE_URL"]).config_set("maxmemory", 1)
        raise RateLimited(retry_after=0.5)
    _note("effect", token)


# --- Workflows and cancellation (tests/integration/test_workflows.py) ---


@dramatiq.actor(queue_name=QUEUE, store_results=True)
def add(*numbers: int) -> int:
    """The sum of the arguments (the previous step's result comes last)."""
    return sum(numbers)


@dramatiq.actor(queue_name=QUEUE, store_results=True)
def square(i: int, hold: bool = False) -> int:
    """``i * i``; with ``hold``, the first attempt says it is running (key ``holding:<i>``) and
    then waits, so that the test can kill its worker mid-run."""
    attempts = store.rpush(key(f"square:{i}"), f"{time.time():.6f}")
    if hold and attempts == 1:
        store.set(key(f"holding:{i}"), "1")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.05)
    return i * i


@dramatiq.actor(queue_name=QUEUE)
def sized(size: int) -> str:
    """A result of ``size`` characters (``size + 2`` bytes as JSON): one too large to hand on."""
    return "x" * size


@dramatiq.actor(queue_name=QUEUE, throws=(Permanent,))
def square_fails(i: int) -> int:
    """Fail for good: a chord member that ends in the dead letters."""
    raise Permanent(f"no square of {i} today")


@dramatiq.actor(queue_name=QUEUE, store_results=True)
def total(results: list[int]) -> int:
    """Note every run with the results it got (``total`` list), then sum them."""
    store.rpush(key("total"), json.dumps(results))
    return sum(results)


def _tick(token: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        store.rpush(key(f"tick:{token}"), f"{time.time():.6f}")
        time.sleep(0.05)


@dramatiq.actor(queue_name=QUEUE, store_results=True, idempotency_key=lambda token, seconds: token)
def ticking(token: str, seconds: float) -> str:
    """Work for ``seconds``, writing a progress tick (time) every 50 ms: ticks stop when it stops."""
    _tick(token, seconds)
    return token


@dramatiq.actor(queue_name=QUEUE, interruptible=False)
def gated(token: str) -> str:
    """Say it runs (key ``gated:<token>``), then wait until the test opens the gate (key
    ``open:<token>``, 30 s at most): a barrier the test holds while it cancels the job."""
    store.set(key(f"gated:{token}"), "1")
    deadline = time.monotonic() + 30
    while not store.exists(key(f"open:{token}")) and time.monotonic() < deadline:
        time.sleep(0.01)
    return token


@dramatiq.actor(queue_name=QUEUE, interruptible=False)
def ticking_uninterruptible(token: str, seconds: float) -> str:
    """:func:`ticking`, declared not interruptible."""
    _tick(token, seconds)
    store.set(key(f"done:{token}"), "1")
    return token


# --- Sends to another service's actors, from sync and async actors (integration/test_actor_label.py) ---

if os.environ.get("TEST_ASYNCIO"):
    dramatiq.get_broker().add_middleware(AsyncIO())  # async actors run on its event loop thread


def _send_elsewhere(token: str, actor_name: str, how: str) -> None:
    """Send a message to ``actor_name``, an actor this worker does not have (another service's),
    on the test's queue ``elsewhere``; note its message id as ``sent:<how>:<token>``. Delayed ten
    minutes: a worker consumes every queue its broker declares (Dramatiq adds a consumer), so an
    undelayed message could be taken, failed as an unknown actor and recorded ``unknown`` before
    its sender's own write, which the test reads (the record's actor is written once)."""
    message: dramatiq.Message[Any] = dramatiq.Message(
        queue_name=settings.queue("elsewhere"), actor_name=actor_name, args=(token,), kwargs={}, options={}
    )
    sent = dramatiq.get_broker().enqueue(message, delay=600_000)
    store.set(key(f"sent:{how}:{token}"), sent.message_id)


@dramatiq.actor(queue_name=QUEUE)
def send_elsewhere(token: str, actor_name: str) -> None:
    """From a worker thread: send to another service's actor."""
    _send_elsewhere(token, actor_name, "sync")


@dramatiq.actor(queue_name=QUEUE)
async def send_elsewhere_async(token: str, actor_name: str) -> None:
    """From the event loop thread (``TEST_ASYNCIO``): send to another service's actor, from the
    coroutine itself and from a thread of ``asyncio.to_thread``."""
    await asyncio.sleep(0)
    _send_elsewhere(token, actor_name, "async")
    await asyncio.to_thread(_send_elsewhere, token, actor_name, "to_thread")
