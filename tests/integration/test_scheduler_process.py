"""``python -m scheduler`` end to end: real scheduler and worker processes, RabbitMQ, the state store.

The test actor ``scheduled`` records the fire time each message carries; every assertion is about
those recorded fire times: each fire runs once, no second is skipped, the restart coalesces.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from middleware.idempotency import Idempotency
from scheduler.service import fire_key, fire_message_id, parse_utc_iso
from tests import workload
from tests.senders import sender_broker
from tests.support import BIN, ROOT, TEST_REDIS_URL, wait_for, worker_env

LEASE_MS = 2_000

TICK = """
[[schedule]]
id = "tick"
actor = "scheduled"
args = ["tick"]
every = "1s"
misfire_grace = "30s"
"""


class SchedulerProcess:
    """``python -m scheduler tests.workload`` in a subprocess, its JSON log captured to a file."""

    def __init__(self, log_path: Path, env: dict[str, str], schedules: Path) -> None:
        self.log_path = log_path
        self.log = log_path.open("ab")
        self.proc = subprocess.Popen(
            [str(BIN / "python"), "-m", "scheduler", "tests.workload", "--schedules", str(schedules)],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def events(self, name: str) -> list[dict[str, Any]]:
        found = []
        for line in self.output().splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and record.get("event") == name:
                    found.append(record)
        return found

    def wait_event(self, name: str, timeout: float = 30.0) -> dict[str, Any]:
        def seen() -> dict[str, Any] | None:
            if self.proc.poll() is not None and not self.events(name):
                raise AssertionError(f"scheduler exited with {self.proc.returncode}:\n{self.output()}")
            events = self.events(name)
            return events[0] if events else None

        event: dict[str, Any] = wait_for(seen, timeout, what=name)
        return event

    def fired(self) -> set[int]:
        """The fire times (epoch seconds) this process published."""
        return {_seconds(e["fire_time"]) for e in self.events("schedule_fired")}

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        finally:
            self.log.close()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self.log.close()


def _seconds(iso: str) -> int:
    return int(parse_utc_iso(iso).timestamp())


@pytest.fixture
def start_scheduler(prefix: str, tmp_path: Path, queues) -> Iterator[Callable[..., SchedulerProcess]]:
    """Start scheduler processes on the test's queues and namespace; all are killed after."""
    started: list[SchedulerProcess] = []

    def start(schedules: str, **env: str) -> SchedulerProcess:
        path = tmp_path / "schedules.toml"
        path.write_text(schedules)
        log = tmp_path / f"scheduler-{len(started)}.log"
        environment = worker_env(prefix, tmp_path, SCHEDULER_LEASE_MS=str(LEASE_MS), **env)
        process = SchedulerProcess(log, environment, path)
        started.append(process)
        return process

    yield start
    for process in started:
        if process.proc.poll() is None:
            process.kill()


def fires(store, prefix: str) -> list[int]:
    """The fire times the worker ran, in epoch seconds, in the order they ran."""
    return [_seconds(t) for t in store.lrange(f"test:{prefix}fires:tick", 0, -1)]


def fired_ids(*schedulers: SchedulerProcess) -> list[str]:
    """The message ids the schedulers published."""
    return [e["message_id"] for s in schedulers for e in s.events("schedule_fired")]


def settle(queues, worker, *schedulers: SchedulerProcess) -> None:
    """Wait until every message the (stopped) schedulers published has run, then stop the worker:
    nothing may be left in the queue, so the fire times recorded are all there will be."""
    finished = queues.wait_finished(fired_ids(*schedulers))
    assert {r.state for r in finished.values()} == {"succeeded"}
    assert queues.left_after_stop([worker], queues.name(workload.scheduled)) == 0


def assert_consecutive(times: list[int]) -> None:
    assert len(times) == len(set(times)), f"a fire ran twice: {sorted(times)}"
    assert sorted(times) == list(range(min(times), max(times) + 1)), f"a fire is missing: {sorted(times)}"


def test_every_second_sends_once_per_second_to_a_worker(
    start_worker, start_scheduler, queues, store, prefix, state_url
):
    worker = start_worker(STATE_URL=state_url)
    scheduler = start_scheduler(TICK, STATE_URL=state_url)
    loaded = scheduler.wait_event("schedule_loaded")
    assert (loaded["schedule"], loaded["spec"], loaded["queue"]) == ("tick", "every 1s", f"{prefix}workload")
    assert loaded["next_fire_utc"].endswith("Z")
    wait_for(lambda: len(fires(store, prefix)) >= 4, timeout=30, what="four fires")
    assert scheduler.stop() == 0
    assert scheduler.events("scheduler_stopped")
    sent = scheduler.fired()
    settle(queues.using(sender_broker(prefix, state_url)), worker, scheduler)
    assert_consecutive(fires(store, prefix))
    assert set(fires(store, prefix)) == sent
    # Each message carried the fire's idempotency key; the worker completed it.
    idempotency = next(m for m in sender_broker(prefix, state_url).middleware if hasattr(m, "lookup"))
    for second in sent:
        key = f"schedule:tick:{datetime.fromtimestamp(second, UTC):%Y-%m-%dT%H:%M:%SZ}"
        record = idempotency.lookup("scheduled", key)
        assert record is not None and record.state == "done", key


def test_two_schedulers_run_each_fire_once_across_a_take_over(
    start_worker, start_scheduler, queues, store, prefix
):
    worker = start_worker()
    leader = start_scheduler(TICK)
    leader.wait_event("scheduler_leader")
    standby = start_scheduler(TICK)
    assert standby.wait_event("scheduler_standby")["leader"] == leader.wait_event("scheduler_leader")["owner"]
    wait_for(lambda: len(fires(store, prefix)) >= 3, timeout=30, what="three fires")
    leader.kill()  # SIGKILL: no release, the lease has to lapse
    killed = time.time()
    elected = standby.wait_event("scheduler_leader", timeout=30)
    wait_for(lambda: max(fires(store, prefix)) >= killed + 3, timeout=30, what="fires after the take-over")
    assert standby.stop() == 0
    sent_by_leader, sent_by_standby = leader.fired(), standby.fired()
    sent = sent_by_leader | sent_by_standby
    settle(queues, worker, leader, standby)
    times = fires(store, prefix)
    assert set(times) == sent
    assert_consecutive(times)  # nothing lost in the take-over gap, nothing run twice
    assert not sent_by_leader & sent_by_standby  # and no fire published by both
    # The standby stayed quiet while the leader lived, and took over within the lease's TTL
    # (plus the standby's attempt period and slack for a busy machine).
    first_send = min(
        datetime.fromisoformat(e["timestamp"]).timestamp() for e in standby.events("schedule_fired")
    )
    assert first_send >= killed
    assert datetime.fromisoformat(elected["timestamp"]).timestamp() - killed < LEASE_MS * 1.1 / 1000 + 2.0


def test_a_restart_within_the_grace_sends_the_missed_fire_once(
    start_worker, start_scheduler, queues, store, prefix
):
    worker = start_worker()
    first = start_scheduler(TICK)
    wait_for(lambda: len(fires(store, prefix)) >= 2, timeout=30, what="two fires")
    assert first.stop() == 0
    before = first.fired()
    queues.wait_finished(fired_ids(first))  # the first fires ran
    time.sleep(3.5)  # down for three fires or more
    second = start_scheduler(TICK)
    coalesced = second.wait_event("schedule_misfire_coalesced")
    wait_for(lambda: len(fires(store, prefix)) >= len(before) + 3, timeout=30, what="fires after the restart")
    assert second.stop() == 0
    after = second.fired()
    settle(queues, worker, first, second)
    times = fires(store, prefix)
    assert len(times) == len(set(times)) and set(times) == before | after
    # The fires missed while no scheduler ran: only the latest was sent, once, by the catch-up.
    missed = list(range(max(before) + 1, min(after)))
    assert len(missed) >= 2 and not set(missed) & set(times)
    assert coalesced["missed"] == len(missed) + 1
    catch_up = second.events("schedule_fired")[0]
    assert catch_up["fire_time"] == coalesced["fire_time"] and catch_up["missed"] is True
    assert _seconds(catch_up["fire_time"]) == min(after)
    assert_consecutive(sorted(after))  # then every second again


def test_a_fire_a_dead_leader_registered_but_never_published_is_sent(
    start_worker, start_scheduler, queues, store, prefix
):
    """A leader killed between a fire's key registration and its publish leaves the key pending:
    the fire's message id is derived from its key, so the next send of it is the same message,
    which its own registration lets through, instead of a duplicate of a message never sent."""
    worker = start_worker()
    scheduler = start_scheduler(TICK)
    scheduler.wait_event("schedule_loaded")
    idempotency = next(
        m for m in sender_broker(prefix, TEST_REDIS_URL).middleware if isinstance(m, Idempotency)
    )
    first = int(time.time()) + 3
    registered = range(first, first + 4)
    for second in registered:
        fire = datetime.fromtimestamp(second, UTC)
        key = idempotency.scoped("scheduled", fire_key("tick", fire))
        assert idempotency.backend.register(key, fire_message_id("tick", fire), 60_000) is None
    wait_for(lambda: max(fires(store, prefix), default=0) >= first + 5, timeout=30, what="the fires after")
    assert scheduler.stop() == 0
    settle(queues, worker, scheduler)
    assert set(registered) <= set(fires(store, prefix))
    assert not scheduler.events("schedule_fire_duplicate")
