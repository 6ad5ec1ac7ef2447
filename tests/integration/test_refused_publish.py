"""Follow-up publishes RabbitMQ refuses (a ``max-length`` + ``reject-publish`` policy): the delivery
is held and requeued with a growing delay, counted, and alerted on; the actor does not run again
for an outcome already decided, and the follow-up is published once RabbitMQ takes it."""

from __future__ import annotations

import json
from typing import Any

import pika
import pytest

from jobsystem.system import get_system
from tests import workload
from tests.servers import sentry_events, sentry_server
from tests.support import wait_for


@pytest.mark.parametrize("processes", [1, 2])
def test_a_refused_retry_backs_off_alerts_and_runs_the_actor_once(
    start_worker, queues, store, prefix, processes
):
    """With two worker processes the redelivery often reaches the other one: it learns what was
    decided from the state store and does not run the actor again either."""
    queue = queues.name(workload.flaky)
    queues.broker.declare_queue(queue, ensure=True)
    attempts = f"test:{prefix}attempt:r1"
    with sentry_server() as (dsn, envelopes):
        worker = start_worker(processes=processes, JOB_MIN_BACKOFF_MS="100", SENTRY_DSN=dsn)
        with queues.capped(queue + ".DQ", 0):  # every retry publish is refused by RabbitMQ
            message = queues.send(workload.flaky, "r1", failures=1)

            def refused() -> list[dict[str, Any]]:
                lines: list[dict[str, Any]] = worker.events(
                    "follow_up_publish_refused", message_id=message.message_id
                )
                return lines

            wait_for(lambda: len(refused()) >= 3, timeout=60, what="three refusals")
            # Today's Dramatiq requeues at once: ~200 runs in these seconds. Held, it ran once.
            assert store.llen(attempts) == 1
            counts = [(line["refusals"], line["level"], line["delay_ms"]) for line in refused()[:3]]
            assert counts == [(1, "warning", 1000), (2, "warning", 2000), (3, "error", 4000)]
            assert {line["kind"] for line in refused()} == {"retry"}
            # The alert reached Sentry as an error event (the logging integration).
            wait_for(
                lambda: any(
                    "follow_up_publish_refused" in json.dumps(e.get("logentry") or e.get("message"))
                    for e in sentry_events(list(envelopes))
                ),
                timeout=30,
                what="the alert in Sentry",
            )
        # RabbitMQ takes publishes again: the redelivery publishes the decided retry, counted.
        wait_for(lambda: store.llen(f"test:{prefix}effect:r1") == 1, timeout=60, what="the retry's run")
    assert store.llen(attempts) == 2
    (published,) = worker.events("follow_up_published", message_id=message.message_id)
    assert published["kind"] == "retry" and published["refusals"] >= 3
    # The second run's job_started line may still be in the worker's log batch: wait for it.
    started = wait_for(
        lambda: (lines := worker.events("job_started", message_id=message.message_id))[1:] and lines,
        what="both runs' job_started lines",
    )
    assert [line["attempt"] for line in started] == [1, 2]  # the refused attempt was counted


def test_a_malformed_message_whose_dead_letter_is_refused_is_held_then_dead_lettered_once(
    start_worker, queues, store, prefix
):
    queue = queues.name(workload.record)
    queues.broker.declare_queue(queue, ensure=True)
    worker = start_worker()
    with queues.capped(queue + ".DLQ", 0):
        get_system().broker.channel.basic_publish(
            "", queue, b'{"options": null}', pika.BasicProperties(message_id="poison-held")
        )
        for i in range(5):
            queues.send(workload.record, f"behind-{i}")

        def refused() -> list[dict[str, Any]]:
            lines: list[dict[str, Any]] = worker.events("follow_up_publish_refused", message_id="poison-held")
            return lines

        wait_for(lambda: len(refused()) >= 2, timeout=60, what="two refusals")
        wait_for(lambda: store.scard(f"test:{prefix}tokens") == 5, what="the jobs behind it")
        assert [line["delay_ms"] for line in refused()[:2]] == [1000, 2000]
        assert queues.depth(queue + ".DLQ") == 0
    wait_for(lambda: queues.depth(queue + ".DLQ") == 1, timeout=60, what="the dead letter, once accepted")
    (letter,) = queues.peek(queue + ".DLQ")
    assert letter["properties"]["message_id"] == "poison-held" and letter["payload"] == '{"options": null}'
    assert letter["properties"]["headers"]["x-dl-reason"] == "malformed"
    assert len(worker.events("message_malformed", message_id="poison-held")) == 1
    wait_for(lambda: worker.events("follow_up_published", message_id="poison-held"), what="the log line")
