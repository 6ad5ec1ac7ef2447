"""The worker's Prometheus endpoint serves the counters of every worker process and queue depths."""

from __future__ import annotations

import socket

import requests
from prometheus_client.parser import text_string_to_metric_families

from tests import workload
from tests.servers import free_port
from tests.support import wait_for

#: Samples by (name, labels): what an endpoint served.
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> Samples | None:
    try:
        text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    except requests.RequestException:
        return None
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_endpoint_serves_the_counters_after_jobs_ran(start_worker, queues, prefix, tmp_path):
    port = free_port()
    start_worker(processes=2, PROMETHEUS_PORT=str(port), PROMETHEUS_DIR=str(tmp_path / "metrics"))
    sent = [queues.send(workload.record, f"m{i}") for i in range(6)]
    sent.append(queues.send(workload.permanent, "m-dead"))
    sent.append(queues.send(workload.flaky, "m-retry", failures=1))
    # Metrics counts in its after hooks, which run before Status writes the final state.
    finished = queues.wait_finished(sent)
    assert sorted(r.state for r in finished.values()) == ["dead"] + ["succeeded"] * 7
    queue = f"{prefix}workload"

    def labels(actor: str) -> frozenset[tuple[str, str]]:
        return frozenset({"queue_name": queue, "actor_name": actor}.items())

    def counted() -> Samples | None:
        metrics = scrape(port)
        if not metrics:
            return None
        # Each worker process applies its counts every second: wait for both processes' share.
        # The retry is counted as it is enqueued, after its attempt: it may come a flush later.
        done = metrics.get(("dramatiq_messages_total", labels("flaky"))) == 2
        done = done and metrics.get(("dramatiq_message_retries_total", labels("flaky"))) is not None
        done = done and metrics.get(("dramatiq_messages_total", labels("record"))) == 6
        return (
            metrics if done and metrics.get(("dramatiq_message_rejects_total", labels("permanent"))) else None
        )

    metrics = wait_for(counted, what="the counters on the endpoint")
    assert metrics[("dramatiq_messages_total", labels("record"))] == 6  # summed over both processes
    assert metrics[("dramatiq_message_duration_milliseconds_count", labels("record"))] == 6
    assert metrics[("dramatiq_message_errors_total", labels("permanent"))] == 1
    assert metrics[("dramatiq_message_rejects_total", labels("permanent"))] == 1
    assert metrics[("dramatiq_message_errors_total", labels("flaky"))] == 1
    assert metrics[("dramatiq_message_retries_total", labels("flaky"))] == 1  # not counted again from .DQ
    assert metrics[("dramatiq_messages_inprogress", labels("record"))] == 0
    # Queue depths, asked from RabbitMQ at scrape time for the queues the workers consume.
    assert metrics[("jobs_queue_stats_up", frozenset())] == 1
    assert metrics[("jobs_queue_messages", frozenset({"queue": queue, "state": "dead"}.items()))] == 1
    assert metrics[("jobs_queue_messages", frozenset({"queue": queue, "state": "waiting"}.items()))] == 0
    assert metrics[("jobs_queue_consumers", frozenset({"queue": queue}.items()))] == 2


def test_counts_are_exact_once_the_worker_stopped(start_worker, queues, prefix, tmp_path):
    """Counts gathered in-process are applied at shutdown: jobs finished just before it count."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    directory = tmp_path / "metrics"
    worker = start_worker(processes=2, PROMETHEUS_PORT=str(free_port()), PROMETHEUS_DIR=str(directory))
    sent = [queues.send(workload.record, f"x{i}") for i in range(40)]
    finished = queues.wait_finished(sent)
    assert [r.state for r in finished.values()] == ["succeeded"] * 40
    assert worker.stop() == 0
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory / f"group-{worker.proc.pid}"))  # type: ignore[no-untyped-call]
    labels = {"queue_name": f"{prefix}workload", "actor_name": "record"}
    assert registry.get_sample_value("dramatiq_messages_total", labels) == 40
    assert registry.get_sample_value("dramatiq_message_duration_milliseconds_count", labels) == 40
    assert (
        registry.get_sample_value("dramatiq_message_duration_milliseconds_bucket", {**labels, "le": "+Inf"})
        == 40
    )


def test_endpoint_binds_once_its_port_is_free(start_worker, queues, tmp_path):
    """A port still held (the last group's endpoint stopping, a client connection given the port)
    does not leave the group without metrics: the endpoint keeps trying, and the jobs run meanwhile."""
    port = free_port()  # outside the ephemeral range: no client connection takes it once freed
    holder = socket.socket()
    holder.bind(("127.0.0.1", port))
    holder.listen()
    try:
        worker = start_worker(PROMETHEUS_PORT=str(port), PROMETHEUS_DIR=str(tmp_path / "metrics"))
        sent = queues.send(workload.record, "while-held")
        assert queues.wait_finished([sent])[sent.message_id].state == "succeeded"
        failed = wait_for(lambda: worker.events("metrics_server_failed"), what="the failed bind logged")
        assert failed[0]["port"] == port
        assert failed[0]["attempt"] == 1
        assert worker.proc.poll() is None
    finally:
        holder.close()
    wait_for(lambda: worker.events("metrics_server_started", port=port), what="the endpoint bound")
    metrics = wait_for(lambda: scrape(port), what="the endpoint answering")
    assert metrics[("jobs_queue_stats_up", frozenset())] == 1
