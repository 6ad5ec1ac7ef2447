"""What health, its alerts and the metrics say of a dependency that did not answer: which one, and
the error's class name at most, never the error's own text.

That text names hosts and ports (RabbitMQ's: every node's URL, the password masked; the state
store's: its address, and a URL in a driver's message may hold a password): ``jobctl health``
printed it, ``--json`` carried it, and the ``check_health`` alert sent it to Sentry. It stays in
the log only (which is scrubbed), as the dashboard already had it.
"""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import prometheus_client
import pytest
import sentry_sdk
import structlog
from click.testing import CliRunner, Result
from sentry_sdk.transport import Transport

import jobctl.main as cli
from bench.ports import free_port
from jobsystem.observability.metrics import _QueueCollector
from jobsystem.ops import alerts, health
from jobsystem.ops.queue_counts import AmqpCounts, QueueCounts
from jobsystem.settings import Settings, load_settings
from jobsystem.store.base import StoreUnavailable
from jobsystem.store.sqlite import SqliteStore

HOST, PORT, TOKEN = "10.20.30.40", 6390, "hunter2-token"
#: What a store's error says of itself: its address, and a URL with a password.
STORE_ERROR = (
    f"redis: ConnectionError: Error 111 connecting to {HOST}:{PORT} (redis://:{TOKEN}@{HOST}:{PORT}/0)"
)


class _Refusing:
    """Store operations that all fail as a store that is down does."""

    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any, **kwargs: Any) -> Any:
            raise StoreUnavailable(STORE_ERROR)

        return fail


class FailingStore(SqliteStore):
    """A state store whose every call fails with :data:`STORE_ERROR`."""

    def operations(self, backends: Any) -> Any:
        return _Refusing()

    def acquire_lease(self, name: str, owner: str, ttl_ms: int) -> bool:
        raise StoreUnavailable(STORE_ERROR)


class Capture(Transport):
    """A Sentry transport that keeps the envelopes instead of sending them."""

    envelopes: ClassVar[list[Any]] = []

    def capture_envelope(self, envelope: Any) -> None:
        Capture.envelopes.append(envelope)


@pytest.fixture(autouse=True)
def info_level(logging_restored: None) -> None:
    """Log lines from INFO up, as ``jobctl``'s default ``LOG_LEVEL`` (structlog's own default
    prints DEBUG too, on the stdout the runner reads; ``configure_logging`` would have the
    modules' loggers cached, which ``capture_logs`` then cannot reach)."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))


@pytest.fixture
def failing(tmp_path: Path) -> FailingStore:
    return FailingStore(tmp_path / "state.db")


@pytest.fixture
def rabbitmq_down() -> tuple[Settings, list[str]]:
    """Settings whose RabbitMQ and management API refuse connections; what of them must not show."""
    amqp, management = free_port(), free_port()
    settings = load_settings(
        {
            "RABBITMQ_URL": f"amqp://app:{TOKEN}@127.0.0.1:{amqp}/%2F?connection_attempts=1",
            "RABBITMQ_MANAGEMENT_URL": f"http://127.0.0.1:{management}",
            "SENTRY_DSN": "https://key@o0.ingest.sentry.io/1",
        }
    )
    return settings, [f"127.0.0.1:{amqp}", f"127.0.0.1:{management}", TOKEN]


@pytest.fixture
def rabbitmq_up(monkeypatch: pytest.MonkeyPatch) -> Settings:
    """RabbitMQ as health sees it, answering, without RabbitMQ: one healthy queue ``q``."""
    counted = {"q": QueueCounts(waiting=0, consumers=1, delayed=0, delay_consumers=1, dead=0)}
    monkeypatch.setattr(health, "count_queues", lambda *_a, **_kw: AmqpCounts(counted, "delay.unroutable", 0))
    monkeypatch.setattr(health, "queue_stats", lambda *_a, **_kw: {})
    return load_settings({"SENTRY_DSN": "https://key@o0.ingest.sentry.io/1"})


STORE_SECRETS = [f"{HOST}:{PORT}", HOST, TOKEN]


def _shown(text: str, secrets: list[str]) -> list[str]:
    return [secret for secret in secrets if secret in text]


def _jobctl_health(monkeypatch: pytest.MonkeyPatch, settings: Settings, store: Any, *args: str) -> Result:
    broker = SimpleNamespace(actors={"job": SimpleNamespace(queue_name="q")})
    system = SimpleNamespace(settings=settings, broker=broker, store=store)
    monkeypatch.setattr(cli, "load_system", lambda: system)
    return CliRunner().invoke(cli.main, ["health", "--timeout", "3", *args])


def _alerted(monkeypatch: pytest.MonkeyPatch, settings: Settings, store: Any) -> tuple[str, list[Any]]:
    """The Sentry events the alert of a fresh check sends, as JSON text, and the log lines."""
    client = sentry_sdk.Client(dsn=settings.sentry_dsn, transport=Capture, default_integrations=False)
    monkeypatch.setattr(alerts, "_sentry_client", lambda *_: client)
    Capture.envelopes.clear()
    report = health.check(["q"], config=settings, state=store, timeout=3)
    with structlog.testing.capture_logs() as logged:
        # A fresh logger: alerts' own may be cached by another test's configure_logging (-n 2),
        # and a cached logger keeps its processors, which capture_logs cannot replace.
        monkeypatch.setattr(alerts, "logger", structlog.get_logger(alerts.__name__))
        opened = alerts.alert(report, state=store, settings=settings)
    assert opened and len(Capture.envelopes) == len(opened), (opened, Capture.envelopes)
    events = [item.payload.json for envelope in Capture.envelopes for item in envelope.items]
    return json.dumps(events), logged


def _metrics(tmp_path: Path, settings: Settings, store: Any) -> str:
    (tmp_path / "queues-1.json").write_text(json.dumps(["q"]))
    registry = prometheus_client.CollectorRegistry()
    depths = functools.partial(health.queue_depths, settings, timeout=3, state=store)
    registry.register(_QueueCollector(tmp_path, depths))
    return prometheus_client.generate_latest(registry).decode()


def test_an_unreachable_rabbitmq_is_named_without_its_nodes(monkeypatch, tmp_path, rabbitmq_down, failing):
    settings, secrets = rabbitmq_down
    shown = _jobctl_health(monkeypatch, settings, failing)
    as_json = _jobctl_health(monkeypatch, settings, failing, "--json")
    sent, logged = _alerted(monkeypatch, settings, failing)
    metrics = _metrics(tmp_path, settings, failing)
    for text in (shown.output, as_json.output, sent, metrics):
        assert _shown(text, secrets + STORE_SECRETS) == [], text
    assert shown.exit_code == 2, shown.output
    assert shown.output.startswith("unreachable  RabbitMQ unreachable ("), shown.output
    assert as_json.exit_code == 2 and json.loads(as_json.output)["error"].startswith("RabbitMQ unreachable")
    assert "RabbitMQ unreachable" in sent and "jobs_queue_stats_up 0.0" in metrics
    # Lines at WARNING and up become Sentry breadcrumbs and events: no error text in them.
    (degraded,) = [line for line in logged if line["event"] == "queue_degraded"]
    assert "cause" not in degraded and _shown(json.dumps(logged), secrets + STORE_SECRETS) == []


def test_a_state_store_that_fails_is_named_without_its_address(monkeypatch, tmp_path, rabbitmq_up, failing):
    shown = _jobctl_health(monkeypatch, rabbitmq_up, failing)
    as_json = _jobctl_health(monkeypatch, rabbitmq_up, failing, "--json")
    sent, logged = _alerted(monkeypatch, rabbitmq_up, failing)
    metrics = _metrics(tmp_path, rabbitmq_up, failing)
    for text in (shown.output, as_json.output, sent, metrics):
        assert _shown(text, STORE_SECRETS) == [], text
    detail = "state store unreachable, no totals (StoreUnavailable)"
    assert shown.exit_code == 1 and f"  {detail}" in shown.output.splitlines(), shown.output
    assert json.loads(as_json.output)["problems"] == [{"kind": "state_store", "detail": detail}]
    assert detail in sent and "jobs_queue_stats_up 1.0" in metrics
    (degraded,) = [line for line in logged if line["event"] == "queue_degraded"]
    (unrecorded,) = [line for line in logged if line["event"] == "health_alert_state_unavailable"]
    assert "cause" not in degraded and unrecorded["error"] == "StoreUnavailable"
    assert _shown(json.dumps(logged), STORE_SECRETS) == []
