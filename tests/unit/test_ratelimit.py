"""Rate limits in-process: the configuration checks, and the RateLimits middleware's paths with
its hooks called as the worker calls them, on each state store backend (take, wait for a slot,
deferral for a reserved slot, the upstream's "slow down", unusable buckets, the store down)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import SkipMessage

from jobsystem.dramatiq_internals import dead_letter_reason
from jobsystem.limits import Limit, RateLimitConfigError
from jobsystem.privacy.setup import get_key_hasher, get_scrubber
from jobsystem.settings import SettingsError, load_settings
from jobsystem.stack import build_middleware
from jobsystem.store import StateStore, open_store
from middleware import ratelimit
from middleware.ratelimit import SLOT, STORE_WAITS, RateLimited, RateLimits
from middleware.slot_priority import PRIORITY
from tests.unit.stub import RecordingBroker, delivery


def test_rate_limits_setting_parses_rates_and_default_bursts():
    assert set(load_settings({}).rate_limits) == {"smtp"}
    spec = {"smtp": {"rate": "100/minute", "burst": 20}, "stripe": {"rate": 25}, "x": {"rate": 0.5}}
    parsed = load_settings({"RATE_LIMITS": json.dumps(spec)}).rate_limits
    assert parsed["smtp"] == Limit(rate=100 / 60, burst=20)
    assert parsed["stripe"] == Limit(rate=25, burst=25)  # one second's worth
    assert parsed["x"] == Limit(rate=0.5, burst=1)  # at least 1
    assert load_settings({"RATE_LIMITS": '{"h": {"rate": "36/hour"}}'}).rate_limits["h"].rate == 0.01


@pytest.mark.parametrize(
    ("value", "service"),
    [
        ('{"smtp": {"rate": "hunter2/second"}}', "smtp"),
        ('{"smtp": {"rate": 5}, "stripe": {"rate": -1}}', "stripe"),
        ('{"stripe": {"rate": 5, "burst": 0}}', "stripe"),
        ('{"stripe": {"rate": 5, "bursts": 3}}', "stripe"),
        ('{"stripe": "hunter2"}', "stripe"),
    ],
)
def test_a_malformed_rate_limit_names_the_setting_and_the_service(value, service):
    with pytest.raises(SettingsError) as caught:
        load_settings({"RATE_LIMITS": value})
    assert "RATE_LIMITS" in str(caught.value) and repr(service) in str(caught.value)
    assert "hunter2" not in str(caught.value)


def test_rate_limit_reservations_may_reach_past_the_consumer_timeout():
    # Slots far ahead are waited for in RabbitMQ's delay cascade, not held by a worker.
    assert load_settings({"RATE_LIMIT_MAX_DELAY_MS": "10800000"}).rate_limit_max_delay_ms == 10_800_000
    with pytest.raises(SettingsError, match="RATE_LIMIT_WAIT_MS"):
        load_settings({"RATE_LIMIT_MAX_DELAY_MS": "1000"})
    with pytest.raises(SettingsError, match="RATE_LIMITS"):
        load_settings({"RATE_LIMITS": "not json"})


@pytest.fixture
def stub(tmp_path):
    limits = {"smtp": Limit(rate=10, burst=5)}
    broker = StubBroker(middleware=[RateLimits(open_store(f"sqlite:///{tmp_path}/s.db"), limits)])
    yield broker
    broker.close()


def test_a_static_rate_limit_must_name_a_configured_service(stub):
    def job() -> None: ...

    dramatiq.actor(broker=stub, rate_limit="smtp:tenant-1")(job)
    dramatiq.actor(broker=stub, actor_name="per_tenant", rate_limit=lambda: "any")(job)
    with pytest.raises(RateLimitConfigError, match="'smtpp' is not configured"):
        dramatiq.actor(broker=stub, actor_name="typo", rate_limit="smtpp")(job)
    with pytest.raises(RateLimitConfigError, match="exceeds the bucket's burst"):
        dramatiq.actor(broker=stub, actor_name="greedy", rate_limit="smtp", rate_limit_cost=6)(job)


def test_a_job_is_deferred_not_run_unmetered_while_the_store_is_down():
    from dramatiq.broker import MessageProxy

    from jobsystem.store.redis import RedisStore

    down = RedisStore("redis://127.0.0.1:1/0", socket_timeout=0.2)
    middleware = RateLimits(down, {"smtp": Limit(rate=10, burst=5)}, store_retry_ms=2_000)
    broker = StubBroker(middleware=[middleware])
    job = dramatiq.actor(broker=broker, actor_name="job", rate_limit="smtp")(lambda: None)
    message = MessageProxy(job.message().copy(options={"retries": 2}))
    with pytest.raises(SkipMessage):
        middleware.before_process_message(broker, message)
    (copy,) = (dramatiq.Message.decode(body) for body in broker.queues[f"{job.queue_name}.DQ"].queue)
    assert copy.message_id == message.message_id and copy.options["retries"] == 2
    assert copy.options[STORE_WAITS] == 1 and copy.options["eta"] >= copy.message_timestamp + 2_000
    broker.close()


class Setup:
    """A bucket ``api`` of ``burst`` tokens refilled at ``rate`` a second, and an actor spending
    from it (or from the bucket its ``bucket`` argument names)."""

    def __init__(self, store: StateStore, rate: float = 20, burst: float = 1, **options: Any) -> None:
        self.middleware = RateLimits(
            store, {"api": Limit(rate=rate, burst=burst)}, wait_ms=0, max_delay_ms=60_000, **options
        )
        self.broker = RecordingBroker(middleware=[self.middleware])
        self.actor = dramatiq.actor(
            broker=self.broker, actor_name="call", queue_name="q", rate_limit=lambda bucket="api": bucket
        )(lambda bucket="api": None)

    def before(self, message: Any) -> Any:
        proxy = delivery(message)
        self.middleware.before_process_message(self.broker, proxy)
        return proxy


@pytest.fixture
def limited(store: StateStore) -> Iterator[Setup]:
    setup = Setup(store)
    yield setup
    setup.broker.close()


def test_a_token_lets_the_job_run_and_an_empty_bucket_defers_it_for_a_reserved_slot(limited):
    limited.before(limited.actor.message())  # the burst's one token: runs
    message = limited.actor.message().copy(options={"retries": 1})
    with pytest.raises(SkipMessage, match="deferred"):
        limited.before(message)
    ((copy, delay),) = limited.broker.enqueued
    assert copy.message_id == message.message_id and copy.options["retries"] == 1  # no retry spent
    assert copy.options[SLOT]["bucket"] == "api" and delay is not None and delay >= 0


def test_a_message_back_for_its_slot_runs_without_taking_again(limited):
    limited.before(limited.actor.message())
    with pytest.raises(SkipMessage):
        limited.before(limited.actor.message())
    ((copy, _),) = limited.broker.enqueued
    limited.before(copy)  # back (a little early): waits for its slot, then runs
    with pytest.raises(SkipMessage):  # its token was taken once: the next one waits behind it
        limited.before(limited.actor.message())
    later = limited.broker.enqueued[-1][0].options[SLOT]["at"]
    assert later > copy.options[SLOT]["at"]


def test_an_upstream_429_drains_the_bucket_and_requeues_the_job_without_a_retry(limited):
    proxy = limited.before(limited.actor.message().copy(options={"retries": 2}))
    try:
        raise RateLimited(retry_after=5)  # what the actor raised; the worker then skips the message
    except RateLimited:
        limited.middleware.after_skip_message(limited.broker, proxy)
    ((copy, delay),) = limited.broker.enqueued
    assert copy.message_id == proxy.message_id and copy.options["retries"] == 2 and not proxy.failed
    assert delay is not None and delay >= 5_000 - limited.middleware.slot_lead_ms
    with pytest.raises(SkipMessage):  # drained: every other job backs off too
        limited.before(limited.actor.message())


def test_an_upstream_wait_longer_than_the_longest_delay_drains_the_bucket_no_longer(limited):
    # X-RateLimit-Reset (an epoch timestamp) passed as retry_after: 55 years, or overflowing.
    for retry_after in (1.7e9, 1e306):
        proxy = limited.before(limited.actor.message())
        try:
            raise RateLimited(retry_after=retry_after)
        except RateLimited:
            limited.middleware.after_skip_message(limited.broker, proxy)
        level = limited.middleware.backend.peek("api", 20, 1)
        assert level.blocked_until_ms - time.time() * 1000 <= limited.middleware.max_delay_ms
        assert limited.broker.enqueued[-1][1] <= limited.middleware.max_delay_ms
        limited.middleware.backend.reset("api")


def test_a_skip_that_is_not_the_upstreams_leaves_the_message_alone(limited):
    proxy = limited.before(limited.actor.message())
    try:
        raise SkipMessage("a duplicate")
    except SkipMessage:
        limited.middleware.after_skip_message(limited.broker, proxy)
    assert limited.broker.enqueued == []


@pytest.mark.parametrize("bucket", ["apii", 42, ""])
def test_a_bucket_that_cannot_be_used_dead_letters_the_message(limited, bucket):
    proxy = delivery(limited.actor.message(bucket))
    with pytest.raises(SkipMessage, match="unusable"):
        limited.middleware.before_process_message(limited.broker, proxy)
    assert proxy.failed and dead_letter_reason(proxy) == "rejected"


def test_a_tenants_bucket_is_its_own_and_named_by_a_hash(limited):
    limited.before(limited.actor.message("api:tenant-1"))
    limited.before(limited.actor.message("api:tenant-2"))  # another budget: runs too
    with pytest.raises(SkipMessage):
        limited.before(limited.actor.message("api:tenant-1"))
    bucket = limited.broker.enqueued[0][0].options[SLOT]["bucket"]
    assert bucket.startswith("api:") and "tenant-1" not in bucket


def test_a_tenant_typed_in_two_unicode_forms_has_one_bucket(limited):
    composed, decomposed = "api:caf\u00e9", "api:cafe\u0301"  # NFC (Linux) and NFD (macOS)
    limited.before(limited.actor.message(composed))
    with pytest.raises(SkipMessage):  # the same tenant's budget: spent, not a second one
        limited.before(limited.actor.message(decomposed))


def test_a_named_bucket_kept_per_actor_never_serves_a_message_with_its_own_options(store):
    limits = {name: Limit(rate=0.01, burst=1) for name in ("api", "other", "third")}
    middleware = RateLimits(store, limits, wait_ms=0, max_delay_ms=600_000, lease_jobs=0)
    broker = RecordingBroker(middleware=[middleware])
    job = dramatiq.actor(broker=broker, actor_name="named", queue_name="q", rate_limit="api")(lambda: None)

    def run(message: Any) -> None:
        middleware.before_process_message(broker, delivery(message))

    run(job.message())  # api's one token
    run(job.message_with_options(rate_limit="other"))  # its own bucket, which has a token
    with pytest.raises(SkipMessage, match="unusable"):  # its own cost, refused as before
        run(job.message_with_options(rate_limit_cost=0))
    with pytest.raises(SkipMessage, match="deferred"):  # back to the actor's bucket, now empty
        run(job.message())
    del broker.actors["named"]  # an actor of that name declared anew, with another bucket
    again = dramatiq.actor(broker=broker, actor_name="named", queue_name="q", rate_limit="third")
    run(again(lambda: None).message())  # spends from that one, which has a token
    broker.close()


def test_a_slot_forged_in_the_options_runs_only_on_a_token_of_its_own(store, caplog):
    setup = Setup(store, rate=0.1, burst=1)  # a token every 10 s
    setup.before(setup.actor.message())  # the one token
    now_ms = int(time.time() * 1000)
    forged = setup.actor.message().copy(options={SLOT: {"bucket": "api", "at": now_ms + 300}})
    # Not run 300 ms later without a token:
    with caplog.at_level("INFO", logger="middleware.ratelimit"), pytest.raises(SkipMessage, match="deferred"):
        setup.before(forged)
    ((copy, _),) = setup.broker.enqueued
    assert copy.options[SLOT]["at"] >= now_ms + 9_000  # the slot of the token it took
    (unknown,) = (r for r in caplog.records if r.getMessage() == "rate_limit_slot_unknown")
    assert unknown.bucket == "api" and 0 < unknown.early_ms <= 300
    setup.broker.close()


def test_two_copies_of_a_deferred_message_do_not_share_its_token(store, monkeypatch):
    setup = Setup(store, rate=0.5, burst=1, slot_lead_ms=3_000)  # a token every 2 s
    setup.before(setup.actor.message())
    with pytest.raises(SkipMessage):
        setup.before(setup.actor.message())
    ((copy, _),) = setup.broker.enqueued
    slept: list[float] = []  # the copy sleeps to its slot without holding the test up
    monkeypatch.setattr(ratelimit, "time", SimpleNamespace(sleep=slept.append, monotonic=time.monotonic))
    setup.before(copy)  # back for its slot: runs on the token it reserved
    assert len(slept) == 1
    with pytest.raises(SkipMessage, match="deferred"):  # a redelivery of it, meanwhile: a token of its own
        setup.before(copy)
    assert setup.broker.enqueued[-1][0].options[SLOT]["at"] >= copy.options[SLOT]["at"] + 1_900
    setup.broker.close()


def test_a_slot_holder_jumps_the_backlog_and_gets_its_own_priority_back_when_it_runs(store):
    setup = Setup(store, slot_priority=10)
    setup.before(setup.actor.message())  # the burst's one token
    own = setup.actor.message_with_options(broker_priority=3)
    with pytest.raises(SkipMessage, match="deferred"):
        setup.before(own)
    ((copy, _),) = setup.broker.enqueued
    # Re-enqueued (through the delay queue, back to the work queue) with the queue's top priority.
    assert copy.options["broker_priority"] == 10 and copy.options[PRIORITY] == 3
    ran = setup.before(copy)  # back for its slot: sleeps to it and runs
    assert ran.options["broker_priority"] == 3 and PRIORITY not in ran.options
    # A later re-enqueue (a retry, another middleware's deferral) is not promoted.
    assert ran.copy().options["broker_priority"] == 3
    none = setup.actor.message()  # a message without a priority gets none back
    with pytest.raises(SkipMessage, match="deferred"):
        setup.before(none)
    back = setup.broker.enqueued[-1][0]
    assert back.options["broker_priority"] == 10 and back.options[PRIORITY] == 0
    assert "broker_priority" not in setup.before(back).options
    setup.broker.close()


def test_a_slot_holder_deferred_again_keeps_its_own_priority(store):
    setup = Setup(store, rate=0.5, burst=1, slot_priority=10)  # a token every 2 s
    setup.before(setup.actor.message())
    with pytest.raises(SkipMessage):
        setup.before(setup.actor.message_with_options(broker_priority=3))
    with pytest.raises(SkipMessage):  # back too early to sleep to its slot: deferred again
        setup.before(setup.broker.enqueued[-1][0])
    again = setup.broker.enqueued[-1][0]
    assert again.options["broker_priority"] == 10 and again.options[PRIORITY] == 3
    setup.broker.close()


def test_on_plain_queues_nothing_is_promoted(store):
    """A token every 20 s, not every 50 ms: the second message is deferred however long a loaded
    machine stalls the test between the two (a 50 ms stall refilled the bucket and it ran)."""
    slow = Setup(store, rate=0.05)
    slow.before(slow.actor.message())
    with pytest.raises(SkipMessage, match="deferred"):
        slow.before(slow.actor.message_with_options(broker_priority=3))
    ((copy, _),) = slow.broker.enqueued
    assert copy.options["broker_priority"] == 3 and PRIORITY not in copy.options
    slow.broker.close()


@pytest.mark.parametrize(("setting", "top"), [({}, 10), ({"RABBITMQ_MAX_PRIORITY": "0"}, 0)])
def test_the_worker_promotes_slot_holders_to_the_queues_top_priority(tmp_path, setting, top):
    settings = load_settings({"STATE_URL": f"sqlite:///{tmp_path}/s.db", **setting})
    stack = build_middleware(
        settings,
        open_store(settings.state_url),
        scrubber=get_scrubber(settings),
        key_hasher=get_key_hasher(settings),
    )
    (limits,) = (m for m in stack if isinstance(m, RateLimits))
    assert limits.priority.top == top
