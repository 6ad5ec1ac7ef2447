"""A real ``dramatiq actors`` worker fed personal data everywhere: none of it leaves in logs, in the
tracebacks stored in RabbitMQ, or in Sentry events.

Each test runs the same scenario on a worker of its own: the corpus goes into job arguments,
structlog and standard-library log calls (as values and inside messages), exception messages, and
Dramatiq's failure, skip, unknown-actor and malformed-body paths (bodies published by hand with pika),
at LOG_LEVEL=DEBUG so that Dramatiq's argument-dumping DEBUG lines run too.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
from dramatiq import Message

from tests import workload
from tests.pii_corpus import free_text, keyed, leaks
from tests.queues import Queues
from tests.servers import sentry_events, sentry_server
from tests.support import BIN, ROOT, wait_for
from tests.workers import Worker

DEAD_LETTERS = 5  # leaky_failure, the skipped message, the unknown actor, two malformed bodies


@dataclass
class Run:
    """What one scenario left behind."""

    prefix: str
    customer_id: str
    leaky_id: str
    skipped_id: str
    output: str = ""
    lines: list[dict[str, Any]] = field(default_factory=list)
    dead_letters: list[dict[str, Any]] = field(default_factory=list)

    def events(self, event: str, **fields: Any) -> list[dict[str, Any]]:
        """The JSON lines of ``event`` whose fields have the values given."""
        return [
            line
            for line in self.lines
            if line.get("event") == event and all(line.get(k) == v for k, v in fields.items())
        ]


def _jobctl(env: dict[str, str], *args: str) -> str:
    result = subprocess.run(
        [str(BIN / "jobctl"), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    return result.stdout + result.stderr


def _send_everything(queues: Queues, prefix: str) -> Run:
    customer = queues.send(workload.customer_update, keyed(), free_text())
    leaky = queues.send(
        workload.leaky_failure, "Ana Lucia Lopez", "ana.lopez@example.com", free_text(), keyed()
    )
    queue = queues.name(workload.record)
    # Too old for its max_age: AgeLimit skips it to the dead letters.
    old = workload.record.message_with_options(args=("Marta Kowalska",), max_age=1000)
    skipped = queues.broker.enqueue(
        old.copy(queue_name=queue, message_timestamp=int(time.time() * 1000) - 60_000)
    )
    unknown: Message[Any] = Message(
        queue_name=queue, actor_name="no_such_actor", args=(free_text(),), kwargs=keyed(), options={}
    )
    queues.broker.enqueue(unknown)
    for body in (b"\xff\xfe" + free_text().encode(), b"{'not json': '" + free_text().encode() + b"'}"):
        queues.broker.channel.basic_publish(exchange="", routing_key=queue, body=body)
    return Run(prefix, customer.message_id, leaky.message_id, skipped.message_id)


def _scenario(
    start_worker: Callable[..., Worker],
    queues: Queues,
    store: redis.Redis,
    prefix: str,
    until: Callable[[Run], bool] = lambda run: True,
    **env: str,
) -> Run:
    """Run a worker at DEBUG with JSON logs, send it everything, stop it once all is done."""
    worker = start_worker(processes=1, threads=2, LOG_LEVEL="DEBUG", JOB_MAX_RETRIES="1", **env)
    run = _send_everything(queues, prefix)
    dead = queues.name(workload.record) + ".DLQ"
    wait_for(lambda: queues.depth(dead) == DEAD_LETTERS, what="every dead letter")
    wait_for(lambda: store.get(f"test:{prefix}count:customer_update") == "1", what="customer_update")
    wait_for(lambda: until(run), what="the scenario's own condition")
    run.dead_letters = queues.peek(dead)
    assert worker.stop() == 0
    run.output = worker.output()
    run.lines = [json.loads(line) for line in run.output.splitlines() if line.startswith("{")]
    return run


def test_no_personal_data_in_any_process_output_or_stored_traceback(start_worker, queues, store, prefix):
    run = _scenario(start_worker, queues, store, prefix)
    assert leaks(run.output) == []

    # One JSON object a line; only the parent process (no project code) keeps Dramatiq's format.
    assert all("[dramatiq.MainProcess]" in line for line in run.output.splitlines() if line[:1] != "{")
    assert len(run.lines) > 50
    assert all({"timestamp", "level", "event", "logger"} <= set(line) for line in run.lines)

    # Lines logged inside a job carry its context, Dramatiq's own and stdlib lines included.
    context = {
        "message_id": run.customer_id,
        "actor": "customer_update",
        "attempt": 1,
        "queue": f"{prefix}workload",
    }
    for event in ("customer_seen", "customer_rejected", "note with extra"):
        assert len(run.events(event, **context)) == 1, event
    failed = f"Failed to process message leaky_failure(message_id={run.leaky_id}) with unhandled exception."
    assert [line["attempt"] for line in run.events(failed, message_id=run.leaky_id)] == [1, 2]

    # Values are replaced where they were, so the lines stay useful.
    (seen,) = run.events("customer_seen")
    assert (seen["full_name"], seen["email"], seen["phone"]) == ("[name]", "[email]", "[phone]")
    assert seen["channels"] == [{"kind": "mobile", "value": "[phone]"}, ["card", "[card]"]]
    assert run.events("customer_note")[0]["note"].startswith("Customer wrote: [email]; then [email]")

    # Dramatiq's own lines are all there, without argument values or raw bodies.
    events = [line["event"] for line in run.lines]
    assert f"Message record(message_id={run.skipped_id}) was skipped." in events
    assert f"Received message leaky_failure(message_id={run.leaky_id}) with id '{run.leaky_id}'." in events
    assert "Received args=<4 hidden> kwargs=<hidden: >." in events
    # The name a message gives for no registered actor is the sender's text: not shown.
    assert "Received message for undefined actor 'unknown'. Moving it to the DLQ." in events
    malformed = run.events("message_malformed", field="body")  # what is wrong, never the body
    assert len(malformed) == 2 and all(
        line["problem"].startswith("could not be decoded") for line in malformed
    )

    # The dead letter carries the final attempt's traceback in its headers, scrubbed; the body
    # keeps no stored traceback at all; no header of any dead letter holds personal data.
    (leaky,) = [m for m in run.dead_letters if m["properties"].get("message_id") == run.leaky_id]
    headers = leaky["properties"]["headers"]
    assert "RuntimeError: could not bill full_name='[name]' <[email]>" in headers["x-dl-traceback"]
    assert headers["x-dl-attempts"] == 2 and headers["x-dl-reason"] == "retries_exhausted"
    assert "traceback" not in json.loads(leaky["payload"])["options"]
    assert leaks(json.dumps([m["properties"].get("headers") for m in run.dead_letters])) == []
    # The whole chain is in the traceback header: the cause, the group's members, their context.
    for part in ("ExceptionGroup: lookups failed", "LookupError", "During handling of the above"):
        assert part in headers["x-dl-traceback"], part

    # What an operator sees of them: every dead letter shown, then all of them exported and listed.
    queue = queues.name(workload.record)
    env = {**os.environ, "QUEUE_PREFIX": prefix, "LOG_LEVEL": "WARNING"}
    for message_id in (run.leaky_id, run.skipped_id, run.customer_id):
        shown = _jobctl(env, "dlq", "show", message_id, "--queue", queue.removeprefix(prefix))
        assert leaks(shown) == [], shown
    (shown_leaky,) = [_jobctl(env, "dlq", "show", run.leaky_id)]
    assert "<4 positional, hidden>" in shown_leaky and "RuntimeError: could not bill" in shown_leaky
    listed = _jobctl(env, "dlq", "list") + _jobctl(env, "dlq", "export")
    assert leaks(listed) == [], listed


def test_lifecycle_events_of_every_outcome(start_worker, queues, store, prefix):
    run = _scenario(start_worker, queues, store, prefix)

    # Success; customer_update opted in with log_args=True: arguments by parameter name, scrubbed.
    (started,) = run.events("job_started", message_id=run.customer_id)
    assert started["args"]["customer"]["full_name"] == "[name]" and "[email]" in started["args"]["note"]
    (succeeded,) = run.events("job_succeeded", message_id=run.customer_id)
    assert succeeded["level"] == "info" and succeeded["duration_ms"] >= 0

    # Failure, retry, failure, dead letter; no arguments (not opted in).
    retried = run.events("job_started", message_id=run.leaky_id)
    assert [line["attempt"] for line in retried] == [1, 2] and all("args" not in line for line in retried)
    failed = run.events("job_failed", message_id=run.leaky_id)
    assert [(line["attempt"], line["level"], line["exc_type"]) for line in failed] == [
        (1, "warning", "RuntimeError"),
        (2, "error", "RuntimeError"),
    ]
    assert failed[0]["error"].startswith("could not bill full_name='[name]' <[email]>")
    (retry,) = run.events("job_retry_scheduled", message_id=run.leaky_id)
    assert retry["attempt"] == 1 and retry["delay_ms"] >= 200
    (dead,) = run.events("job_dead_lettered", message_id=run.leaky_id)
    assert dead["attempt"] == 2 and dead["actor"] == "leaky_failure" and dead["queue"] == f"{prefix}workload"

    # Skipped by AgeLimit, then dead-lettered; an unknown actor is dead-lettered too.
    (skipped,) = run.events("job_skipped", message_id=run.skipped_id)
    assert skipped["actor"] == "record" and skipped["level"] == "warning"
    assert run.events("job_dead_lettered", message_id=run.skipped_id)
    assert run.events("job_dead_lettered", actor="unknown", reason="unknown_actor")  # not its sender's text


def test_sentry_events_hold_no_personal_data_and_are_tagged_with_the_job(start_worker, queues, store, prefix):
    with sentry_server() as (dsn, envelopes):

        def reported(run: Run) -> bool:
            # A worker process ends with os._exit, past Sentry's exit-time flush: wait for its events.
            events = sentry_events(list(envelopes))
            failures = [e for e in events if e.get("tags", {}).get("message_id") == run.leaky_id]
            malformed = [e for e in events if "message_malformed" in json.dumps(e.get("logentry", {}))]
            return len(failures) == 2 and len(malformed) == 2

        env = {"SENTRY_DSN": dsn, "SENTRY_ENVIRONMENT": "pii-test", "SENTRY_RELEASE": "jobsystem@test"}
        run = _scenario(start_worker, queues, store, prefix, until=reported, **env)
        received = list(envelopes)

    assert leaks(run.output) == []
    for envelope in received:
        assert leaks(envelope.decode("utf-8", "replace")) == []
    events = sentry_events(received)
    failures = [e for e in events if e.get("tags", {}).get("message_id") == run.leaky_id]
    assert len(failures) == 2  # one per attempt
    for event in failures:
        assert event["tags"]["actor"] == "leaky_failure" and event["tags"]["queue"] == f"{prefix}workload"
        assert event["environment"] == "pii-test" and event["release"] == "jobsystem@test"
        data = event["contexts"]["dramatiq"]["data"]  # removed whole by the SDK when it is large
        assert data == "[removed]" or data["args"] == "[removed]"
        (exception,) = [v for v in event["exception"]["values"] if v["type"] == "RuntimeError"]
        assert exception["value"].startswith("could not bill full_name='[name]' <[email]>")
        frames = exception["stacktrace"]["frames"]
        assert all("vars" not in f for f in frames if f["module"].startswith("dramatiq."))
        (actor_frame,) = [f for f in frames if f["function"] == "leaky_failure"]
        assert actor_frame["vars"]["full_name"] == "[name]" and actor_frame["vars"]["email"] == "[email]"
    rejected = [e for e in events if e.get("tags", {}).get("message_id") == run.customer_id]
    assert rejected and any(b["category"] == "tests.workload" for b in rejected[0]["breadcrumbs"]["values"])
