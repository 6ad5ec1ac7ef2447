"""Dead letters end to end: every failure path lands in <queue>.DLQ with its final record, and
`jobctl dlq` lists, shows, retries and purges them without losing one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections import Counter
from typing import Any

import dramatiq
import pika
from dramatiq import Message

from jobsystem.system import get_system
from tests import workload
from tests.jobctl_run import jobctl
from tests.queues import Queues
from tests.support import BIN, ROOT, wait_for
from tests.workers import wait_for_final_events


def dead_letters(
    queues: Queues, actor: dramatiq.Actor[Any, Any] = workload.record
) -> dict[str, dict[str, Any]]:
    return {m["properties"]["message_id"]: m for m in queues.peek(queues.name(actor) + ".DLQ", count=1000)}


def test_every_failure_path_lands_in_the_dead_letters_with_its_final_record(
    start_worker, queues, store, prefix
):
    start_worker(JOB_MAX_RETRIES="2", JOB_MIN_BACKOFF_MS="100")
    queue = queues.name(workload.record)
    # Sent an hour ago with a minute to live: too old whenever it starts. A fresh message with
    # max_age=1 ran instead, about one run in a hundred here: it can start within the millisecond
    # it was sent, and ages are counted in whole milliseconds.
    aged = workload.record.message_with_options(args=("old",), max_age=60_000)
    aged = aged.copy(queue_name=queue, message_timestamp=aged.message_timestamp - 3_600_000)
    sent = {
        "retries_exhausted": queues.send(workload.flaky, "x", failures=100),
        "non_retryable": queues.send(workload.permanent, "p"),
        # Runs until its time limit (300 ms, checked each second) interrupts it: a job of 2 s
        # ended first, and succeeded, when the worker stalled past the check.
        "time_limit": queues.send(workload.too_slow, 120.0),
        "rejected": queues.send(workload.depends, "r", reject=True),
        "age_limit": queues.broker.enqueue(aged),
    }
    # No actor's name: the sender's text, which the record must not carry anywhere.
    unknown: Message[Any] = Message(
        queue_name=queue, actor_name="ana@example.com", args=(), kwargs={}, options={}
    )
    queues.publish_raw(unknown)
    get_system().broker.channel.basic_publish(
        "", queue, b"\xff not a message", pika.BasicProperties(message_id="junk")
    )
    try:
        wait_for(lambda: queues.depth(queue + ".DLQ") == 7, timeout=60, what="seven dead letters")
    except AssertionError:  # once in CI: say which one is missing, and where it is
        there = {m["properties"].get("message_id") for m in queues.peek(queue + ".DLQ")}
        expected = {m.message_id: reason for reason, m in sent.items()}
        expected |= {unknown.message_id: "unknown_actor", "junk": "junk"}
        absent = sorted(reason for message_id, reason in expected.items() if message_id not in there)
        raise AssertionError(f"missing {absent}, {queues.depth(queue)} ready in the queue") from None

    letters = dead_letters(queues)
    # The peek's requeue lands a moment later; until then jobctl (reading what is ready) sees less.
    wait_for(lambda: queues.depth(queue + ".DLQ") == 7, what="the peeked dead letters back in place")
    for reason, message in sent.items():
        headers = letters[message.message_id]["properties"]["headers"]
        assert headers["x-dl-reason"] == reason, (reason, headers)
        assert headers["x-dl-queue"] == queue and headers["x-dl-actor"] == message.actor_name
        assert headers["x-dl-environment"] == prefix  # whose tools may change it
        assert headers["x-dl-enqueued-at"] <= headers["x-dl-failed-at"]
    flaky = letters[sent["retries_exhausted"].message_id]["properties"]["headers"]
    # The final attempt's traceback, not the previous one's (which is all RabbitMQ would keep).
    assert flaky["x-dl-attempts"] == 3 and "attempt 3 of x fails on purpose" in flaky["x-dl-traceback"]
    assert flaky["x-dl-exception"] == "RuntimeError"
    assert (
        letters[sent["time_limit"].message_id]["properties"]["headers"]["x-dl-exception"]
        == "TimeLimitExceeded"
    )
    unknown_headers = letters[unknown.message_id]["properties"]["headers"]
    assert (unknown_headers["x-dl-reason"], unknown_headers["x-dl-actor"]) == ("unknown_actor", "unknown")
    junk = letters["junk"]["properties"]["headers"]  # not a message: dead-lettered as it came
    assert junk["x-dl-reason"] == "malformed" and junk["x-dl-field"] == "body"
    assert junk["x-dl-queue"] == queue and junk["x-dl-attempts"] == 0
    assert junk["x-dl-environment"] == prefix

    listing = jobctl(prefix, "dlq", "list", "--json")
    by_id = {d["message_id"]: d for d in map(json.loads, listing.stdout.splitlines())}
    # An id the scrubber took for a phone number was once listed as "[phone]-fae8-...": say
    # what the listing held if one of the seven is not there as it is.
    missing = ({m.message_id for m in sent.values()} | {unknown.message_id, "junk"}) - by_id.keys()
    assert not missing, (missing, sorted(by_id), listing.stderr[-1000:], queues.depth(queue + ".DLQ"))
    assert by_id["junk"]["reason"] == "malformed"
    assert (by_id[unknown.message_id]["reason"], by_id[unknown.message_id]["actor"]) == (
        "unknown_actor",
        "unknown",
    )
    assert "ana@example.com" not in listing.stdout
    without = jobctl(prefix, "dlq", "list", "--json", "--exception", "-").stdout.splitlines()
    no_exception = {i for i, d in by_id.items() if not d["exception"]}  # one kind at least
    assert no_exception and {json.loads(line)["message_id"] for line in without} == no_exception
    index = queues.broker.dead_letter_index.backend  # the worker's index, filed in the background
    wait_for(lambda: index.get(queue, unknown.message_id) is not None, what="the letter indexed")
    assert index.get(queue, unknown.message_id).actor == "unknown"
    assert {by_id[m.message_id]["reason"] for m in sent.values()} == set(sent)
    shown = jobctl(prefix, "dlq", "show", sent["retries_exhausted"].message_id).stdout
    assert "attempt 3 of x fails on purpose" in shown and "retries_exhausted" in shown
    assert queues.depth(queue + ".DLQ") == 7  # reading removed nothing


def thousand_dead_letters(start_worker, queues, store, prefix, tag: str):
    """1,000 ``depends`` jobs dead-lettered while their dependency was down, which is now back up;
    returns the worker, the queue and its dead-letter queue."""
    store.set(f"test:{prefix}dependency-down", "1")
    worker = start_worker(threads=8)
    queue = queues.name(workload.depends)
    dead = queue + ".DLQ"
    for i in range(1000):
        queues.send(workload.depends, f"{tag}{i}")
    wait_for(lambda: queues.depth(dead) == 1000, timeout=120, what="1,000 dead letters")
    store.delete(f"test:{prefix}dependency-down")  # the dependency is back
    return worker, queue, dead


def test_retry_brings_a_thousand_dead_letters_back_to_one_successful_run_each(
    start_worker, queues, store, prefix
):
    worker, queue, dead = thousand_dead_letters(start_worker, queues, store, prefix, "t")

    result = jobctl(prefix, "dlq", "retry", "--all", "--actor", "depends")
    assert "retried 1000 of 1000 matching, 0 failed" in result.stdout
    # Each replayed message's record went from dead to succeeded; then nothing is left to run.
    queues.wait_totals(queue, timeout=120, succeeded=1000)
    assert queues.left_after_stop([worker], queue) == 0
    assert store.hlen(f"test:{prefix}effects") == 1000
    assert set(store.hvals(f"test:{prefix}effects")) == {"1"}
    assert queues.depth(dead) == 0


def test_killing_retry_midway_loses_nothing(start_worker, queues, store, prefix):
    worker, queue, dead = thousand_dead_letters(start_worker, queues, store, prefix, "k")

    env = {**os.environ, "QUEUE_PREFIX": prefix, "LOG_LEVEL": "WARNING"}
    retry = subprocess.Popen(
        [str(BIN / "jobctl"), "dlq", "retry", "--all", "--batch-size", "10"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for(lambda: store.hlen(f"test:{prefix}effects") >= 100 or retry.poll() is not None, what="progress")
    retry.send_signal(signal.SIGKILL)
    retry.wait(10)
    assert queues.depth(dead) + store.hlen(f"test:{prefix}effects") > 0
    jobctl(prefix, "dlq", "retry", "--all")  # the operator runs it again
    queues.wait_totals(queue, timeout=120, succeeded=1000)  # every message ran to success
    # The killed run may have published copies it had not yet removed from the dead letters, which
    # the second run published again: any still waiting must end as skipped duplicates too.
    left = queues.left_after_stop([worker], queue)
    if left:
        copies = queues.peek(queue, count=left) + queues.peek(queue + ".DQ", count=left)
        second = start_worker(threads=8)
        ids = Counter(json.loads(m["payload"])["message_id"] for m in copies)
        outcomes = wait_for_final_events([second], ids)
        assert all(set(events) == {"duplicate_skipped"} for events in outcomes.values()), outcomes
        assert queues.left_after_stop([second], queue) == 0
    assert store.hlen(f"test:{prefix}effects") == 1000
    assert set(store.hvals(f"test:{prefix}effects")) == {"1"}  # duplicates, if any, were harmless
    assert queues.depth(dead) == 0


def test_purge_removes_exactly_what_the_filters_say(start_worker, queues, store, prefix):
    start_worker()
    dead = queues.name(workload.record) + ".DLQ"
    for i in range(5):
        queues.send(workload.permanent, f"p{i}")
        queues.send(workload.depends, f"r{i}", reject=True)
    wait_for(lambda: queues.depth(dead) == 10, what="ten dead letters")
    keep = queues.send(workload.permanent, "keep")
    wait_for(lambda: queues.depth(dead) == 11, what="one more")

    result = jobctl(prefix, "dlq", "purge", "--all", "--actor", "depends", "--yes")
    assert "purged 5 dead letter(s)" in result.stdout
    assert {m["properties"]["headers"]["x-dl-actor"] for m in queues.peek(dead)} == {"permanent"}
    assert "purged 1 dead letter(s)" in jobctl(prefix, "dlq", "purge", keep.message_id, "--yes").stdout
    assert queues.depth(dead) == 5
    refused = jobctl(prefix, "dlq", "purge", "--all", check=False)  # no --yes, no terminal
    assert refused.returncode != 0 and queues.depth(dead) == 5
    exported = jobctl(prefix, "dlq", "export").stdout.splitlines()
    # On the terminal the body is shown as `show` has it (positional arguments hidden).
    assert len(exported) == 5 and all(
        json.loads(line)["body"]["actor_name"] == "permanent" for line in exported
    )


def test_a_queue_named_on_the_command_line_is_never_another_environments(queues, prefix):
    """Two environments on one vhost: ``--queue`` names one of this QUEUE_PREFIX's queues, so an
    operator of the other cannot purge this one's dead letters nor migrate its queue."""
    queue = queues.name(workload.record)  # this test's prefix: the environment not to touch
    queues.broker.declare_queue(queue, ensure=True)
    queues.broker.channel.basic_publish("", queue + ".DLQ", b'{"not": "theirs"}')
    other = prefix + "staging."
    purge = jobctl(other, "dlq", "purge", "--all", "--yes", "--queue", queue, check=False)
    assert purge.returncode != 0 and f"--queue {queue!r}" in purge.stderr
    migrate = jobctl(other, "migrate-queues", "--queue", queue, check=False, RABBITMQ_MAX_PRIORITY="0")
    assert migrate.returncode != 0 and f"--queue {queue!r}" in migrate.stderr
    assert queues.depth(queue + ".DLQ") == 1
    assert queues.info(queue)["arguments"]["x-max-priority"] == 10  # not recreated


def test_a_dead_letter_whose_queue_is_gone_stays_rather_than_recreate_it(start_worker, queues, prefix):
    """Publishing the replay would declare the queue again, where no worker reads it and no
    dlq command finds it: the dead letter stays, the queue is named, the exit code says so."""
    worker = start_worker()
    queue = queues.name(workload.record)
    queues.send(workload.permanent, "orphan")
    wait_for(lambda: queues.depth(queue + ".DLQ") == 1, what="the dead letter")
    assert worker.stop() == 0
    queues.broker.channel.queue_delete(queue)  # the actor moved to another queue, this one deleted
    result = jobctl(prefix, "dlq", "retry", "--all", check=False)
    assert result.returncode == 1 and f"their queue is gone: {queue}" in result.stdout
    assert queues.depth(queue + ".DLQ") == 1 and queues.declared(queue) is None


def test_ids_that_match_no_dead_letter_are_named_and_fail(queues, prefix):
    queues.broker.declare_queue(queues.name(workload.record), ensure=True)
    retried = jobctl(prefix, "dlq", "retry", "no-such-id", check=False)
    purged = jobctl(prefix, "dlq", "purge", "no-such-id", "--yes", check=False)
    for result in (retried, purged):
        assert result.returncode == 1 and "no dead letter no-such-id" in result.stderr


def test_a_dead_letter_queue_deleted_under_a_running_worker_is_declared_again(start_worker, queues, prefix):
    """The dead letter's publish is unroutable once its .DLQ is gone: the worker declares the
    queue again on its next attempt, instead of holding the delivery until it restarts."""
    start_worker()
    dead = queues.name(workload.record) + ".DLQ"
    queues.send(workload.permanent, "first")
    wait_for(lambda: queues.depth(dead) == 1, what="the first dead letter")
    queues.broker.channel.queue_delete(dead)  # an operator deleted it
    queues.send(workload.permanent, "second")
    wait_for(lambda: queues.declared(dead) is not None and queues.depth(dead) == 1, what="the second")


def test_a_retry_that_cannot_be_published_is_redelivered_not_lost(start_worker, queues, store, prefix):
    """Dramatiq's PR #545 hole: a failed retry publish used to ack, and so lose, the message."""
    queue = queues.name(workload.flaky)
    queues.broker.declare_queue(queue, ensure=True)
    worker = start_worker(JOB_MIN_BACKOFF_MS="100")
    with queues.capped(queue + ".DQ", 0):  # every retry publish is refused by RabbitMQ
        queues.send(workload.flaky, "n1", failures=1)
        wait_for(lambda: "retry_publish_failed" in worker.output(), timeout=60, what="a refused retry")
    wait_for(lambda: store.llen(f"test:{prefix}effect:n1") == 1, timeout=60, what="the redelivered run")


def test_a_dead_letter_that_cannot_be_published_is_held_then_published_without_running_again(
    start_worker, queues, store, prefix
):
    queue = queues.name(workload.permanent)
    queues.broker.declare_queue(queue, ensure=True)
    worker = start_worker()
    with queues.capped(queue + ".DLQ", 0):  # the dead-letter queue refuses everything
        message = queues.send(workload.permanent, "n2")
        wait_for(
            lambda: "dead_letter_publish_failed" in worker.output(), timeout=60, what="a refused dead letter"
        )
        assert queues.depth(queue + ".DLQ") == 0
    wait_for(lambda: queues.depth(queue + ".DLQ") == 1, timeout=60, what="the dead letter, once accepted")
    outcome = wait_for_final_events([worker], {message.message_id: 1})[message.message_id]
    assert outcome == {"job_dead_lettered": 1}
    assert worker.events("job_requeued", message_id=message.message_id)  # each refusal put it back
    # The outcome was decided: the redelivery published the dead letter, it did not run again.
    assert store.llen(f"test:{prefix}attempt:n2") == 1
    (letter,) = queues.peek(queue + ".DLQ")
    assert letter["properties"]["message_id"] == message.message_id
    assert letter["properties"]["headers"]["x-dl-reason"] == "non_retryable"
    assert queues.left_after_stop([worker], queue) == 0
