"""A dependency that fails must not send its address to Sentry through the SDK's logging
integration (on in every worker, the scheduler and the dashboard with ``SENTRY_DSN``): ERROR lines
are events, INFO and WARNING ones breadcrumbs. ab623cf made alerts and the dashboard name a failed
dependency by its error's class, the text at DEBUG; the scheduler, the middleware's and the
runtime's store lines and pika's own lines still sent ``Error 111 connecting to <host>:<port>``,
the store's URL, or pika's ``('127.0.0.1', <port>)``. The text must still reach the log at DEBUG."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pika
import pika.exceptions
import pytest
import structlog
from dramatiq import Message

import scheduler.service
from jobsystem.observability.metrics import _QueueCollector
from jobsystem.ops.dead_letters import forget
from jobsystem.runtime.cancellation import CancelWatch
from jobsystem.runtime.requeue import requeue_later
from jobsystem.store.base import StoreMisconfigured, StoreUnavailable
from jobsystem.store.sqlite import SqliteStore
from middleware.heartbeat import Heartbeat
from middleware.store_check import StoreCheck
from middleware.workflows import Workflows
from tests.servers import free_port, sent_to_sentry
from tests.unit.test_guard import Broken
from tests.unit.test_health_outages import HOST, PORT, STORE_ERROR, FailingStore
from tests.unit.test_scheduler_checkins import HOURLY, Clock, RefusingBroker, leading_scheduler, utc

ADDRESS = f"{HOST}:{PORT}"
#: What a Redis store that is down raises.
DOWN = StoreUnavailable(STORE_ERROR)


def _lines(log: str, event: str) -> list[dict[str, Any]]:
    """The log's JSON lines of ``event``."""
    found = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    return [line for line in found if line.get("event") == event]


def _told(log: str, event: str, level: str, error: BaseException = DOWN) -> None:
    """``event`` was logged once at ``level``, naming ``error`` by its class, and its ``_cause``
    twin at DEBUG with the error's text (scrubbed: its start is enough)."""
    (line,) = _lines(log, event)
    assert (line["level"], line["error"]) == (level, type(error).__name__), line
    causes = _lines(log, f"{event}_cause")
    assert causes and all(c["level"] == "debug" and str(error)[:24] in c["error"] for c in causes), causes


class FlakyStore(SqliteStore):
    """A SQLite store whose operations named in ``failing`` fail as a Redis store that is down does."""

    failing: frozenset[str] = frozenset()

    def _maybe_fail(self, operation: str) -> None:
        if operation in self.failing:
            raise StoreUnavailable(STORE_ERROR)

    def get(self, key: str) -> bytes | None:
        self._maybe_fail("get")
        return super().get(key)

    def set(self, key: str, value: bytes | str, ttl_ms: int | None = None) -> None:
        self._maybe_fail("set")
        super().set(key, value, ttl_ms)

    def acquire_lease(self, name: str, owner: str, ttl_ms: int) -> bool:
        self._maybe_fail("acquire_lease")
        return super().acquire_lease(name, owner, ttl_ms)


class StoreRefusingBroker(RefusingBroker):
    """An enqueue refused by the state store (the idempotency middleware's check) while ``refusing``."""

    def enqueue(self, message: Any) -> Any:
        if self.refusing:
            raise StoreUnavailable(STORE_ERROR)
        return super().enqueue(message)


def test_the_scheduler_with_its_store_down_sends_sentry_no_store_address(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, logging_restored: None
) -> None:
    Clock.install(monkeypatch, utc(2026, 1, 5, 10, 0, 30))
    store, broker = FlakyStore(tmp_path / "state.db"), StoreRefusingBroker()

    def outage() -> None:
        # A fresh logger: the module's may be cached with another test's configuration.
        monkeypatch.setattr(scheduler.service, "logger", structlog.get_logger("scheduler"))
        sched = leading_scheduler(store, broker, started_at=utc(2026, 1, 5, 9, 59))
        store.failing = frozenset({"get"})
        sched.fire(HOURLY.id, True)  # schedule_state_unavailable
        store.failing = frozenset()
        sched.fire(HOURLY.id, True)  # schedule_send_failed, an ERROR
        broker.refusing, store.failing = False, frozenset({"set", "acquire_lease"})
        sched.fire(HOURLY.id, True)  # schedule_last_fire_unsaved
        sched.lease.poll()  # leader_lease_unavailable

    sent, log = sent_to_sentry(outage, log_level="DEBUG")
    assert ADDRESS not in sent and HOST not in sent, sent  # events and breadcrumbs
    assert broker.sent == ["2026-01-05T10:00:00Z"]
    for event, level in [
        ("schedule_state_unavailable", "warning"),
        ("schedule_send_failed", "error"),
        ("schedule_last_fire_unsaved", "warning"),
        ("leader_lease_unavailable", "warning"),
    ]:
        assert event in sent, event  # an event or a breadcrumb of the later one
        _told(log, event, level)


def _dead_member() -> Any:
    return SimpleNamespace(message_id="m-1", options={"workflow": {"id": "w-1", "step": 0}})


def test_the_middleware_with_the_store_down_send_sentry_no_store_address(
    tmp_path: Path, logging_restored: None
) -> None:
    store = FailingStore(tmp_path / "state.db")
    store.label = f"redis://{HOST}:{PORT}/0"  # as a Redis store names itself
    stops: list[str] = []

    def stop(problem: str) -> Any:
        stops.append(problem)
        raise SystemExit(2)

    def outage() -> None:
        workflows = Workflows(store, ttl_ms=60_000, cancel_ttl_ms=60_000)
        workflows._record_dead(None, _dead_member(), deadline=time.monotonic(), wait_s=1.0)  # type: ignore[arg-type]
        Broken(StoreUnavailable(STORE_ERROR)).on_receive(None, _dead_member())
        Heartbeat(store)._beat()
        check = StoreCheck(store, setting="STATE_URL", retry_s=60, on_misconfigured=stop)
        check._unavailable(StoreUnavailable(STORE_ERROR))
        with pytest.raises(SystemExit):
            check._misconfigured(StoreMisconfigured(STORE_ERROR))

    sent, log = sent_to_sentry(outage, log_level="DEBUG")
    assert ADDRESS not in sent and HOST not in sent, sent  # events and breadcrumbs
    for event, level in [
        ("workflow_member_unrecorded", "error"),
        ("guard_failed", "error"),
        ("heartbeat_failed", "warning"),
        ("state_store_unavailable", "warning"),
    ]:
        assert event in sent, event
        _told(log, event, level)
    (misconfigured,) = _lines(log, "state_store_misconfigured")
    assert (misconfigured["level"], misconfigured["error"]) == ("critical", "StoreMisconfigured")
    assert "Error 111 connecting to" in _lines(log, "state_store_misconfigured_cause")[0]["error"]
    assert stops and ADDRESS in stops[0]  # the operator's stderr still names the store


def _refuse(*_: Any, **__: Any) -> Any:
    raise StoreUnavailable(STORE_ERROR)


def test_the_runtime_and_ops_lines_with_a_dependency_down_send_sentry_no_address(
    tmp_path: Path, logging_restored: None
) -> None:
    management = ConnectionError(f"HTTPConnectionPool(host='{HOST}', port={PORT}): Max retries exceeded")

    def unanswered(_: Any) -> Any:
        raise management

    def outage() -> None:
        refusing = SimpleNamespace(enqueue=_refuse)
        assert not requeue_later(refusing, Message("q", "job", (), {}, {}), 0, reason="t", pause_on_failure=0)  # type: ignore[arg-type]
        assert CancelWatch(_refuse, keep_ms=60_000).poll_once() == []
        index = SimpleNamespace(backend=SimpleNamespace(remove=_refuse))
        forget(SimpleNamespace(dead_letter_index=index), [SimpleNamespace(queue="q", message_id="m")])  # type: ignore[arg-type, list-item]
        (tmp_path / "queues-1.json").write_text('["q"]')
        assert len(list(_QueueCollector(tmp_path, unanswered).collect())) == 1  # jobs_queue_stats_up 0

    sent, log = sent_to_sentry(outage, log_level="DEBUG")
    assert ADDRESS not in sent and HOST not in sent, sent  # events and breadcrumbs
    for event in ("requeue_failed", "cancellation_poll_failed", "dead_letter_index_stale"):
        assert event in sent, event
        _told(log, event, "warning")
    _told(log, "queue_depths_failed", "warning", management)


def _connect_refused(port: int) -> Callable[[], None]:
    def connect() -> None:
        url = f"amqp://guest:guest@127.0.0.1:{port}/%2F?connection_attempts=1&socket_timeout=2"
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            pika.BlockingConnection(pika.URLParameters(url))

    return connect


def test_pika_failing_to_connect_sends_sentry_no_address(logging_restored: None) -> None:
    port = free_port()  # nothing listens: refused at once, on this machine
    sent, log = sent_to_sentry(_connect_refused(port), log_level="DEBUG")
    assert "127.0.0.1" not in sent, sent  # the socket's, the destination's
    assert "Socket failed to connect: <socket>; error=111 (<str>)" in sent
    assert "Connection workflow failed: AMQPConnectionWorkflowFailed" in sent
    assert '"exception": {' not in sent  # "Error in _create_connection()." without its traceback
    records = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    tcp = [(r["level"], r["event"]) for r in records if r["event"].startswith("TCP Connection attempt")]
    assert tcp[0][0] == "debug" and f"('127.0.0.1', {port})" in tcp[0][1], records  # pika's, whole
    assert tcp[1:] == [("error", "TCP Connection attempt failed: ConnectionRefusedError; dest=<tuple>")]


def test_pika_at_info_logs_its_errors_by_class_and_nothing_whole(logging_restored: None) -> None:
    sent, log = sent_to_sentry(_connect_refused(free_port()), log_level="INFO")
    assert "127.0.0.1" not in sent and "127.0.0.1" not in log, log
    assert "Connection workflow failed: AMQPConnectionWorkflowFailed" in log


@pytest.mark.parametrize(
    ("msg", "args", "shown"),
    [
        (
            "Received %s frame for channel %i on %s",
            ("Basic.Ack", 3, object()),
            "Received <str> frame for channel 3 on <object>",
        ),
        (
            "Illegal close(200, 'x') request on <SelectConnection params=<host=10.0.0.5 port=5672>>",
            (),
            "Illegal close [values at DEBUG]",
        ),
        ("Transport indicated EOF.", (), "Transport indicated EOF."),
        ("%(host)s down", {"host": "10.0.0.5"}, "[values at DEBUG]"),
        ("100%% done, %0.2f s; %r", (1.5, ValueError("10.0.0.5")), "100% done, 1.5 s; ValueError"),
    ],
)
def test_a_pika_message_is_shown_with_its_values_by_class(msg: str, args: Any, shown: str) -> None:
    from jobsystem.observability.pika_lines import summary  # here: the other tests run on old code too

    record = SimpleNamespace(msg=msg, args=args)
    assert summary(record) == shown  # type: ignore[arg-type]
