"""A real ``dramatiq actors`` run fed personal data everywhere: none of it leaves in logs,
in the tracebacks stored in RabbitMQ, or in Sentry events.

One worker run (module fixture) is shared by the tests below: the corpus goes into job arguments,
structlog and standard-library log calls (as values and inside messages), exception messages,
Dramatiq's failure, skip, unknown-actor and decode-error paths (bodies published by hand with
pika), at LOG_LEVEL=DEBUG so Dramatiq's argument-dumping DEBUG lines run too, with Sentry
reporting to a local endpoint.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from dramatiq import Message

import actors
from tests import workload
from tests.conftest import TEST_REDIS_URL, worker_env
from tests.pii_corpus import free_text, keyed, leaks
from tests.support import Queues, Worker, sentry_events, sentry_server, wait_for

DEAD_LETTERS = 5  # leaky_failure, the skipped message, the unknown actor, two undecodable bodies


@dataclass
class Run:
    prefix: str
    output: str
    lines: list[dict[str, Any]]
    dead_letters: list[dict[str, Any]]
    envelopes: list[bytes]
    leaky_id: str
    customer_id: str
    skipped_id: str


def _send_everything(queues: Queues) -> tuple[str, str, str]:
    customer = queues.send(workload.customer_update, keyed(), free_text())
    leaky = queues.send(
        workload.leaky_failure, "Ana Lucia Lopez", "ana.lopez@example.com", free_text(), keyed()
    )
    queue = queues.name(workload.record)
    # Too old for its max_age: AgeLimit skips it to the dead letters.
    old = workload.record.message_with_options(args=("Marta Kowalska",), max_age=1000)
    skipped = actors.broker.enqueue(
        old.copy(queue_name=queue, message_timestamp=int(time.time() * 1000) - 60_000)
    )
    unknown = Message(
        queue_name=queue, actor_name="no_such_actor", args=(free_text(),), kwargs=keyed(), options={}
    )
    actors.broker.enqueue(unknown)
    channel = actors.broker.channel
    for body in (b"\xff\xfe" + free_text().encode(), b"{'not json': '" + free_text().encode() + b"'}"):
        channel.basic_publish(exchange="", routing_key=queue, body=body)
    return customer.message_id, leaky.message_id, skipped.message_id


def _sentry_sent_everything(envelopes: list[bytes], leaky_id: str) -> bool:
    events = sentry_events(list(envelopes))
    failures = [e for e in events if e.get("tags", {}).get("message_id") == leaky_id]
    decode_errors = [e for e in events if "DecodeError" in json.dumps(e.get("exception", {}))]
    return len(failures) == 2 and len(decode_errors) == 2


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Any:
    prefix = f"t{uuid.uuid4().hex[:10]}-"
    tmp = tmp_path_factory.mktemp("pii")
    queues = Queues(prefix)
    store = redis.Redis.from_url(TEST_REDIS_URL, decode_responses=True)
    with sentry_server() as (dsn, envelopes):
        env = worker_env(
            prefix,
            tmp,
            LOG_LEVEL="DEBUG",
            JOB_MAX_RETRIES="1",
            SENTRY_DSN=dsn,
            SENTRY_ENVIRONMENT="pii-test",
            SENTRY_RELEASE="jobsystem@test",
        )
        worker = Worker(tmp / "worker.log", env, processes=1, threads=2)
        try:
            worker.wait_ready()
            customer_id, leaky_id, skipped_id = _send_everything(queues)
            dead = queues.name(workload.record) + ".XQ"
            wait_for(lambda: queues.depth(dead) == DEAD_LETTERS, what="every dead letter")
            wait_for(lambda: store.get(f"test:{prefix}count:customer_update") == "1", what="customer_update")
            # A worker process ends with os._exit, past Sentry's exit-time flush: wait for its events.
            wait_for(lambda: _sentry_sent_everything(envelopes, leaky_id), what="the Sentry events")
            assert worker.stop() == 0
            yield Run(
                prefix=prefix,
                output=worker.output(),
                lines=[json.loads(line) for line in worker.output().splitlines() if line.startswith("{")],
                dead_letters=queues.peek(dead),
                envelopes=list(envelopes),
                leaky_id=leaky_id,
                customer_id=customer_id,
                skipped_id=skipped_id,
            )
        finally:
            if worker.proc.poll() is None:
                worker.kill()
                worker.proc.wait(10)
            queues.delete_all()
            keys = list(store.scan_iter(f"test:{prefix}*"))
            if keys:
                store.delete(*keys)


def _events(run: Run, event: str, **fields: Any) -> list[dict[str, Any]]:
    return [
        line
        for line in run.lines
        if line.get("event") == event and all(line.get(k) == v for k, v in fields.items())
    ]


def test_no_corpus_value_in_the_output_of_any_process(run):
    assert leaks(run.output) == []


def test_every_worker_line_is_one_json_object_with_the_standard_keys(run):
    for line in run.output.splitlines():
        if line.startswith("{"):
            continue
        # Only the parent process (which imports no project code) keeps Dramatiq's own format.
        assert "[dramatiq.MainProcess]" in line, line
    assert len(run.lines) > 50
    for line in run.lines:
        assert {"timestamp", "level", "event", "logger"} <= set(line), line


def test_lines_logged_inside_a_job_carry_its_context(run):
    context = {"message_id": run.customer_id, "actor": "customer_update", "attempt": 1}
    for event in ("customer_seen", "customer_rejected", "note with extra"):
        (line,) = _events(run, event, **context)
        assert line["queue"] == f"{run.prefix}workload"
    # Dramatiq's own record of the failure, logged inside the job, carries it too.
    failed = _events(
        run, f"Failed to process message leaky_failure(message_id={run.leaky_id}) with unhandled exception."
    )
    assert [line["attempt"] for line in failed] == [1, 2]
    assert all(line["message_id"] == run.leaky_id for line in failed)


def test_values_are_replaced_in_place_so_logs_stay_useful(run):
    (seen,) = _events(run, "customer_seen")
    assert seen["full_name"] == "[name]" and seen["email"] == "[email]" and seen["phone"] == "[phone]"
    assert seen["contacts"] == [{"kind": "mobile", "value": "[phone]"}, ["card", "[card]"]]
    (note,) = _events(run, "customer_note")
    assert note["note"].startswith("Customer wrote: [email]; then [email]")


def test_lifecycle_of_a_job_that_succeeds(run):
    (started,) = _events(run, "job_started", message_id=run.customer_id)
    # customer_update opted in with log_args=True: arguments by parameter name, scrubbed.
    assert started["args"]["customer"]["full_name"] == "[name]"
    assert "[email]" in started["args"]["note"]
    (succeeded,) = _events(run, "job_succeeded", message_id=run.customer_id)
    assert succeeded["level"] == "info" and succeeded["duration_ms"] >= 0


def test_lifecycle_of_a_job_retried_then_dead_lettered(run):
    started = _events(run, "job_started", message_id=run.leaky_id)
    assert [line["attempt"] for line in started] == [1, 2]
    assert all("args" not in line for line in started)  # not opted in
    failed = _events(run, "job_failed", message_id=run.leaky_id)
    assert [(line["attempt"], line["level"]) for line in failed] == [(1, "warning"), (2, "error")]
    assert all(line["exc_type"] == "RuntimeError" for line in failed)
    assert failed[0]["error"].startswith("could not bill full_name='[name]' <[email]>")
    (retry,) = _events(run, "job_retry_scheduled", message_id=run.leaky_id)
    assert retry["attempt"] == 1 and retry["delay_ms"] >= 200
    (dead,) = _events(run, "job_dead_lettered", message_id=run.leaky_id)
    assert dead["attempt"] == 2 and dead["actor"] == "leaky_failure"


def test_lifecycle_of_a_skipped_job(run):
    (skipped,) = _events(run, "job_skipped", message_id=run.skipped_id)
    assert skipped["actor"] == "record" and skipped["level"] == "warning"
    assert _events(run, "job_dead_lettered", message_id=run.skipped_id)
    assert _events(run, "job_dead_lettered", actor="no_such_actor")


def test_dramatiq_own_lines_are_kept_without_argument_values(run):
    events = [line["event"] for line in run.lines]
    assert f"Message record(message_id={run.skipped_id}) was skipped." in events
    assert f"Received message leaky_failure(message_id={run.leaky_id}) with id '{run.leaky_id}'." in events
    assert "Received args=<4 hidden> kwargs=<hidden: >." in events
    assert "Received message for undefined actor 'no_such_actor'. Moving it to the DLQ." in events
    decode_errors = [line for line in run.lines if line["event"].startswith("Failed to decode message")]
    assert len(decode_errors) == 2
    assert all("bytes, body not logged)" in line["exception"] for line in decode_errors)


def test_tracebacks_stored_in_rabbitmq_are_scrubbed(run):
    bodies = [json.loads(m["payload"]) for m in run.dead_letters if m["payload"].startswith('{"')]
    (leaky,) = [body for body in bodies if body["message_id"] == run.leaky_id]
    # RabbitMQ dead-letters the body as last delivered: its traceback is the first attempt's.
    traceback = leaky["options"]["traceback"]
    assert "RuntimeError: could not bill full_name='[name]' <[email]>" in traceback
    assert leaks(traceback) == []


def test_sentry_events_carry_no_corpus_value(run):
    events = sentry_events(run.envelopes)
    assert len(events) >= 4  # the failures, the decode errors, the errors logged by customer_update
    for envelope in run.envelopes:
        assert leaks(envelope.decode("utf-8", "replace")) == []


def test_sentry_events_are_tagged_with_the_job(run):
    events = sentry_events(run.envelopes)
    failures = [e for e in events if e.get("tags", {}).get("message_id") == run.leaky_id]
    assert len(failures) == 2, [e.get("tags") for e in events]  # one per attempt
    for event in failures:
        assert event["tags"]["actor"] == "leaky_failure"
        assert event["tags"]["queue"] == f"{run.prefix}workload"
        assert event["environment"] == "pii-test" and event["release"] == "jobsystem@test"
        assert event["contexts"]["dramatiq"]["data"]["args"] == "[removed]"
        (exception,) = [v for v in event["exception"]["values"] if v["type"] == "RuntimeError"]
        assert exception["value"].startswith("could not bill full_name='[name]' <[email]>")
    decode = [e for e in events if "DecodeError" in json.dumps(e.get("exception", {}))]
    assert len(decode) == 2
