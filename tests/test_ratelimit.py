"""Rate limits end to end: real workers (several processes and threads), real RabbitMQ, each state
store backend; plus the configuration checks, which need no broker.

Start times are noted by the test actor (``workload.limited``) with the host clock, which is also
the store's clock here (Redis and SQLite run on this host). A token is granted by the store, then
the job starts a little later; that lag varies between jobs (thread scheduling, a loaded machine),
so the checks allow ``TIMING_SLACK`` seconds of it: in any window of ``t`` seconds at most
``burst + rate * (t + TIMING_SLACK)`` jobs may start.
"""

from __future__ import annotations

import json
import subprocess

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker

from jobsystem.rabbitmq.bulk import send_bulk
from jobsystem.settings import SettingsError, load_settings
from jobsystem.store import open_store
from middleware.idempotency import Idempotency
from middleware.ratelimit import Limit, RateLimitConfigError, RateLimits
from tests import workload
from tests.conftest import worker_env
from tests.support import BIN, ROOT, sender_broker, wait_for, wait_for_final_events

TIMING_SLACK = 0.1


def limits(**services: dict[str, float]) -> str:
    """A RATE_LIMITS value with the test's services (and ``smtp``, which the email actor needs)."""
    return json.dumps({"smtp": {"rate": 1000, "burst": 1000}, **services})


def starts(store, prefix) -> list[dict]:
    return [json.loads(note) for note in store.lrange(f"test:{prefix}starts", 0, -1)]


def assert_conforms(times: list[float], rate: float, burst: float) -> None:
    """No window between two starts holds more than ``burst + rate * (length + TIMING_SLACK)`` starts."""
    times = sorted(times)
    worst = max(
        (j - i + 1) - (burst + rate * (times[j] - times[i] + TIMING_SLACK))
        for i in range(len(times))
        for j in range(i, len(times))
    )
    assert worst <= 0, f"a window held {worst:.2f} more starts than the bucket allows"


def deferrals(output: str) -> int:
    return output.count('"event": "rate_limited"') - output.count('"action": "wait"')


# -- with workers ----------------------------------------------------------------------------------


def test_two_worker_processes_share_one_bucket(start_worker, queues, store, prefix, state_url):
    worker = start_worker(
        processes=2, threads=4, STATE_URL=state_url, RATE_LIMITS=limits(api={"rate": 20, "burst": 5})
    )
    sender = queues.using(sender_broker(prefix, state_url))  # the worker's store: its status records
    tokens = [f"j{i}" for i in range(200)]
    send_bulk([sender.message(workload.limited, token, "api") for token in tokens], broker=sender.broker)
    queue = queues.name(workload.limited)
    sender.wait_totals(queue, timeout=90, succeeded=200)
    assert queues.left_after_stop([worker], queue) == 0
    notes = starts(store, prefix)
    assert sorted(n["token"] for n in notes) == sorted(tokens)  # each job ran once
    times = sorted(n["t"] for n in notes)
    assert times[-1] - times[0] >= (200 - 5) / 20 - TIMING_SLACK
    assert_conforms(times, rate=20, burst=5)
    assert {n["retries"] for n in notes} == {0}
    assert queues.depth(queues.name(workload.limited) + ".DLQ") == 0


def test_tenants_have_their_own_buckets_and_long_waits_are_deferred(
    start_worker, queues, store, prefix, state_url
):
    worker = start_worker(
        threads=4,
        STATE_URL=state_url,
        RATE_LIMITS=limits(mail={"rate": 2, "burst": 2}),
        RATE_LIMIT_WAIT_MS="200",  # waits beyond 200 ms re-enqueue the message
    )
    sender = queues.using(sender_broker(prefix, state_url))
    sent = {}
    for tenant in "ab":
        for i in range(6):
            token = f"{tenant}{i}"
            message = sender.send_with_options(
                workload.limited, args=(token, f"mail:{tenant}"), idempotency_key=token
            )
            sent[token] = message.message_id
    finished = sender.wait_finished(sent.values())
    assert {r.state for r in finished.values()} == {"succeeded"}
    notes = starts(store, prefix)
    assert sorted(n["token"] for n in notes) == sorted(sent)  # once each
    assert {n["token"]: n["id"] for n in notes} == sent  # under its own message id
    assert {n["retries"] for n in notes} == {0}
    for tenant in "ab":
        times = sorted(n["t"] for n in notes if n["bucket"] == f"mail:{tenant}")
        assert_conforms(times, rate=2, burst=2)
        assert times[-1] - times[0] >= (6 - 2) / 2 - TIMING_SLACK
    # Independent budgets: both tenants' bursts went at once, more than one bucket of 2 allows.
    first = min(n["t"] for n in notes)
    assert sum(n["t"] < first + 0.4 for n in notes) >= 4
    assert deferrals(worker.output()) >= 8  # 4 waits per tenant were longer than 200 ms
    # The deferred copies kept their idempotency keys: each key is completed by its own message.
    keys = next(m for m in sender.broker.middleware if isinstance(m, Idempotency))

    def completed() -> bool:  # completion marks are written a moment after the job (deferred)
        records = {token: keys.lookup(workload.limited.actor_name, token) for token in sent}
        return all(
            r is not None and r.state == "done" and r.message_id == sent[t] for t, r in records.items()
        )

    wait_for(completed, what="every key completed by its own message")
    queue = queues.name(workload.limited)
    assert queues.left_after_stop([worker], queue) == 0
    assert len(starts(store, prefix)) == 12  # no copy ran later either
    assert queues.depth(queue + ".DLQ") == 0


def test_an_upstream_429_delays_the_job_and_drains_the_bucket_without_a_retry(
    start_worker, queues, store, prefix, state_url
):
    worker = start_worker(
        threads=4, STATE_URL=state_url, RATE_LIMITS=limits(partner={"rate": 50, "burst": 5})
    )
    sender = queues.using(sender_broker(prefix, state_url))  # the worker's store: its status records
    x = sender.send(workload.limited, "x", "partner", upstream_429=1.5)
    wait_for(lambda: '"action": "upstream"' in worker.output(), what="the 429 handled")
    y = sender.send(workload.limited, "y", "partner")
    finished = sender.wait_finished([x, y])
    assert {r.state for r in finished.values()} == {"succeeded"}
    queue = queues.name(workload.limited)
    assert queues.left_after_stop([worker], queue) == 0
    notes = starts(store, prefix)
    x1, x2 = sorted((n for n in notes if n["token"] == "x"), key=lambda n: n["t"])
    (y,) = (n for n in notes if n["token"] == "y")
    assert x2["t"] - x1["t"] >= 1.5 - TIMING_SLACK  # delayed by Retry-After
    assert y["t"] - x1["t"] >= 1.5 - TIMING_SLACK  # the other job backed off too
    assert x2["id"] == x1["id"] and x2["retries"] == 0  # not failed, no retry spent
    assert queues.depth(queue + ".DLQ") == 0


def test_a_backlog_beyond_the_horizon_is_rechecked_not_spun(start_worker, queues, store, prefix):
    worker = start_worker(
        threads=4,
        RATE_LIMITS=limits(slow={"rate": 5, "burst": 1}),
        RATE_LIMIT_MAX_DELAY_MS="2000",  # slots at most 2 s ahead: 10 of the 30 jobs get one at once
        RATE_LIMIT_WAIT_MS="100",
    )
    send_bulk([queues.message(workload.limited, f"s{i}", "slow") for i in range(30)], broker=queues.broker)
    queue = queues.name(workload.limited)
    queues.wait_totals(queue, timeout=90, succeeded=30)
    assert queues.left_after_stop([worker], queue) == 0  # the log below is complete too
    notes = starts(store, prefix)
    assert_conforms([n["t"] for n in notes], rate=5, burst=1)
    assert {n["retries"] for n in notes} == {0} and sorted(n["token"] for n in notes) == sorted(
        f"s{i}" for i in range(30)
    )
    # Each job went back to RabbitMQ a few times at most while it waited its turn: no hot loop.
    assert deferrals(worker.output()) <= 4 * 30


def test_a_bucket_of_an_unknown_service_dead_letters_the_job(start_worker, queues, store, prefix):
    worker = start_worker(RATE_LIMITS=limits())
    message = queues.send(workload.limited, "u", "nope:tenant-1")
    dead = queues.name(workload.limited) + ".DLQ"
    outcome = wait_for_final_events([worker], {message.message_id: 1})[message.message_id]
    assert outcome == {"job_dead_lettered": 1} and queues.depth(dead) == 1
    assert "rate_limit_invalid" in worker.output() and "'nope' is not configured" in worker.output()
    assert store.llen(f"test:{prefix}starts") == 0


def test_an_actor_naming_an_unconfigured_service_stops_the_worker_at_start(prefix, tmp_path):
    env = worker_env(prefix, tmp_path, RATE_LIMITS=json.dumps({"api": {"rate": 1}}))
    proc = subprocess.run(
        [str(BIN / "dramatiq"), "actors", "tests.workload", "-p", "1", "-t", "1"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert (
        "'send_email': rate_limit service 'smtp' is not configured in RATE_LIMITS"
        in proc.stdout + proc.stderr
    )


# -- configuration ---------------------------------------------------------------------------------


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


def test_rate_limit_delays_stay_well_below_the_consumer_timeout():
    with pytest.raises(SettingsError) as caught:
        load_settings({"RATE_LIMIT_MAX_DELAY_MS": "1200000"})  # 20 min of the default 30
    assert "RATE_LIMIT_MAX_DELAY_MS" in str(caught.value) and "RABBITMQ_CONSUMER_TIMEOUT_MS" in str(
        caught.value
    )
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
    from dramatiq.middleware import SkipMessage

    from jobsystem.store.redis import RedisStore
    from middleware.ratelimit import STORE_WAITS

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
