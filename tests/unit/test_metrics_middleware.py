"""The metrics middleware's labels, its retry count, its group directory: without a worker or
sample files (the counts are read from a stand-in for the tally)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import dramatiq
import pytest
from click.testing import CliRunner
from dramatiq.brokers.stub import StubBroker

from jobctl.main import main
from jobsystem.rabbitmq.consumer import DeadLetteringConsumer
from jobsystem.runtime.follow_ups import RetryFollowUp
from jobsystem.settings import load_settings
from middleware.metrics import Metrics


def counting(tmp_path: Path) -> Metrics:
    """A metrics middleware as in a worker process, its counts going to a stand-in."""
    metrics = Metrics(tmp_path)
    metrics._instruments = mock.Mock()
    metrics.tally = mock.Mock()
    return metrics


def mocked(stand_in: object) -> mock.Mock:
    """An attribute :func:`counting` replaced, read back as the mock it is."""
    assert isinstance(stand_in, mock.Mock)
    return stand_in


def labels_used(tally: mock.Mock) -> set[tuple[str, str]]:
    """Every (queue, actor) label pair the tally was given."""
    found = set()
    for call in tally.mock_calls:
        for argument in call.args:
            if isinstance(argument, tuple) and len(argument) == 2:
                found.add(argument)
    return found


def test_a_queue_or_actor_the_broker_does_not_know_is_labelled_unknown(tmp_path: Path):
    """Anyone who may publish chooses the names in a body: they must not become series."""
    broker = StubBroker()

    @dramatiq.actor(broker=broker, queue_name="known")
    def job() -> None: ...

    metrics = counting(tmp_path)
    stranger: dramatiq.Message[Any] = dramatiq.Message("known", "jane.doe@example.com", (), {}, {})
    for message in (stranger, dramatiq.Message("elsewhere", "job", (), {}, {})):
        proxy = dramatiq.broker.MessageProxy(message)
        metrics.before_process_message(broker, proxy)
        metrics.after_process_message(broker, proxy, exception=RuntimeError("no such actor"))
        metrics.after_enqueue(broker, message, 1_000)  # its retry
        metrics.after_nack(broker, proxy)
    assert labels_used(mocked(metrics.tally)) == {("known", "unknown"), ("unknown", "job")}


def test_a_retry_the_consumer_publishes_after_rabbitmq_refused_it_is_counted_as_a_retry(tmp_path: Path):
    """The retry of a failed attempt whose first publish was refused is published on the
    delivery's return by the consumer, on its own thread: still the retry, not a delayed send."""
    metrics = counting(tmp_path)
    broker = StubBroker(middleware=[metrics])

    @dramatiq.actor(broker=broker, queue_name="q")
    def flaky() -> None: ...

    consumer: Any = object.__new__(DeadLetteringConsumer)  # no connection: only its decision
    consumer.broker = SimpleNamespace(enqueue=broker.enqueue, refused_follow_ups=mock.Mock())
    consumer.queue_name, consumer._settle = "q", mock.Mock()
    retry = flaky.message_with_options(retries=1)
    consumer._publish_decided(7, retry.message_id, RetryFollowUp(retry, 1_000))
    tally, instruments = mocked(metrics.tally), mocked(metrics._instruments)
    assert tally.count.call_args_list == [mock.call(instruments.retries, ("q", "flaky"))]


def test_jobctl_worker_empties_its_group_directory_before_it_becomes_dramatiq(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    """dramatiq keeps jobctl's PID (1 in a container, every time): samples of a group by that PID
    are a previous run's, whose processes may have been killed before marking themselves dead."""
    settings = load_settings({"PROMETHEUS_DIR": str(tmp_path)})
    stale, other = tmp_path / f"group-{os.getpid()}", tmp_path / "group-999999999"
    for group in (stale, other):
        group.mkdir()
        (group / "gauge_livesum_7.db").write_bytes(b"\0" * 8)
    monkeypatch.setattr("jobctl.main.load_system", lambda: SimpleNamespace(settings=settings))
    monkeypatch.setenv("dramatiq_worker_timeout", "100")
    seen: list[tuple[bool, bool]] = []

    def execv(path: str, argv: list[str]) -> None:
        seen.append((stale.exists(), other.exists()))
        raise SystemExit(0)

    monkeypatch.setattr(os, "execv", execv)
    result = CliRunner().invoke(main, ["worker"])
    assert result.exit_code == 0, result.output
    assert seen == [(False, True)]
