"""Health alerts on the real store backends: what opens is sent once, what was not measured stays
open, and a store that fails (down, or only when the lease is given back) never swallows an alert."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Literal

import pytest
import structlog

from jobsystem.ops import alerts
from jobsystem.ops.health import HealthReport, Problem, QueueHealth
from jobsystem.store.base import StateStore, StoreUnavailable
from jobsystem.store.redis import RedisStore

SETTINGS: Any = SimpleNamespace(sentry_dsn=None)


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The conditions sent to Sentry."""
    conditions: list[str] = []
    monkeypatch.setattr(alerts, "_send_to_sentry", lambda _s, condition, *_: conditions.append(condition))
    return conditions


def report(*queues: QueueHealth, problems: tuple[Problem, ...] = ()) -> HealthReport:
    status: Literal["degraded", "healthy"] = (
        "degraded" if problems or any(q.problems for q in queues) else "healthy"
    )
    return HealthReport(status, list(queues), "management", problems=list(problems))


def aged(queue: str = "q") -> QueueHealth:
    problems = [Problem("oldest_age", "oldest waiting 900 s > 600 s")]
    return QueueHealth(queue, waiting=1, consumers=1, oldest_age_s=900.0, problems=problems)


def test_an_age_the_check_could_not_measure_is_not_taken_as_recovered(store: StateStore, sent: list[str]):
    assert alerts.alert(report(aged()), state=store, settings=SETTINGS) == ["oldest_age:q"]
    # The management API did not answer (or the peek failed): no age, which is not a young one.
    unmeasured = QueueHealth("q", waiting=1, consumers=1)
    unmeasured.unjudged = ["oldest_age"]
    with structlog.testing.capture_logs() as logged:
        assert alerts.alert(report(unmeasured), state=store, settings=SETTINGS) == []
    assert [e["event"] for e in logged] == []
    assert alerts.alert(report(aged()), state=store, settings=SETTINGS) == []  # still open: not again
    with structlog.testing.capture_logs() as logged:
        alerts.alert(report(QueueHealth("q", waiting=0, consumers=1)), state=store, settings=SETTINGS)
    assert [(e["event"], e["condition"]) for e in logged] == [("queue_recovered", "oldest_age:q")]
    assert sent == ["oldest_age:q"]


def test_stranded_delays_the_check_could_not_count_are_not_taken_as_recovered(
    store: StateStore, sent: list[str]
):
    stranded = Problem("unroutable_delays", "1 delayed messages found no delay queue")
    assert alerts.alert(report(problems=(stranded,)), state=store, settings=SETTINGS) == ["unroutable_delays"]
    unmeasured = report()
    unmeasured.unjudged = ["unroutable_delays"]  # the queue could not be counted this time
    with structlog.testing.capture_logs() as logged:
        assert alerts.alert(unmeasured, state=store, settings=SETTINGS) == []
    assert [e["event"] for e in logged] == []
    assert alerts.alert(report(problems=(stranded,)), state=store, settings=SETTINGS) == []  # not again
    assert sent == ["unroutable_delays"]


def test_while_the_store_is_down_every_condition_is_sent_at_each_check(sent: list[str]):
    down = RedisStore("redis://127.0.0.1:1/0", socket_timeout=0.2)
    degraded = report(aged(), problems=(Problem("state_store", "state store unreachable"),))
    for _ in range(2):
        with structlog.testing.capture_logs() as logged:
            sent_now = alerts.alert(degraded, state=down, settings=SETTINGS)
        assert sorted(sent_now) == ["oldest_age:q", "state_store"]
        assert logged[0]["event"] == "health_alert_state_unavailable" and logged[0]["log_level"] == "error"
    assert sorted(sent) == ["oldest_age:q", "oldest_age:q", "state_store", "state_store"]


class _LeaseNotReleased:
    """A store that records everything but fails when the lease is given back."""

    def __init__(self, store: StateStore) -> None:
        self.store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def release_lease(self, name: str, owner: str) -> bool:
        raise StoreUnavailable("connection lost")


def test_conditions_recorded_as_open_are_sent_though_the_lease_could_not_be_given_back(
    store: StateStore, sent: list[str]
):
    failing: Any = _LeaseNotReleased(store)
    assert alerts.alert(report(aged()), state=failing, settings=SETTINGS) == ["oldest_age:q"]
    assert sent == ["oldest_age:q"]
    holder = store.lease_holder("health:check")  # it would expire within a minute
    assert holder is not None and store.release_lease("health:check", holder)
    assert alerts.alert(report(aged()), state=store, settings=SETTINGS) == []  # recorded as open
