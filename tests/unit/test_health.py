"""The health verdict without RabbitMQ: the queues' numbers stand in, the state store is real."""

from __future__ import annotations

import pytest

from jobsystem.ops import health
from jobsystem.ops.health import QueueHealth
from jobsystem.settings import load_settings
from jobsystem.store.redis import RedisStore


def test_a_state_store_that_does_not_answer_degrades_the_check(monkeypatch: pytest.MonkeyPatch):
    """Every guarded job is deferred while the store is down: the check must not say healthy."""
    served = QueueHealth("q", waiting=0, consumers=1, delayed=0, dead=0)
    monkeypatch.setattr(health, "measure", lambda *_args, **_kw: ([served], "management", []))
    down = RedisStore("redis://127.0.0.1:1/0", socket_timeout=0.2)
    report = health.check(["q"], config=load_settings({}), state=down)
    assert (report.status, report.exit_code) == ("degraded", 1)
    assert [p.kind for p in report.problems] == ["state_store"]
    assert report.queues[0].verdict == "healthy"  # the queue itself is fine
    assert report.to_dict()["problems"][0]["kind"] == "state_store"
