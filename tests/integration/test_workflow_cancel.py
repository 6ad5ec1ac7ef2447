"""Cancellation end to end with a real worker: running, delayed and non-interruptible jobs, a
workflow's members (one message shared by two workflows included), and ``jobctl cancel``."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
import redis
from dramatiq.broker import MessageProxy
from dramatiq.results import ResultFailure

from actors.workflows import cancel, group, pipeline
from jobsystem.runtime.cancellation import CANCELLED, JobCancelled
from middleware.idempotency import Idempotency
from middleware.results import StoreResults
from middleware.status import Status
from middleware.workflows import find_workflows
from tests import workload
from tests.integration.workflow_support import (
    flow_state,
    jobctl,
    launched,
    member_state,
    recorded,
    run_backend,
)
from tests.senders import sender_broker
from tests.support import TEST_REDIS_URL, wait_for


def ticks(store: redis.Redis, key: Callable[[str], str], token: str) -> list[float]:
    return [float(t) for t in store.lrange(key(f"tick:{token}"), 0, -1)]


def test_cancelling_a_running_job_stops_it_within_a_second(start_worker, sender, store, state_url, key):
    worker = start_worker(STATE_URL=state_url)
    message = sender.send(workload.ticking, "long", 30)
    wait_for(lambda: len(ticks(store, key, "long")) >= 3, what="the job ticking")
    cancelled_at = time.time()
    assert cancel(message.message_id, broker=sender.broker) == [message.message_id]
    record = wait_for(
        lambda: (r := sender.status(message.message_id)) is not None and r.state == "cancelled" and r,
        what="the cancelled status",
    )
    assert max(ticks(store, key, "long")) - cancelled_at < 1.0
    with pytest.raises(ResultFailure) as failure:
        message.get_result(backend=run_backend(sender), block=True, timeout=10_000)
    assert failure.value.orig_exc_type == "JobCancelled"
    # Its idempotency key was given up: a deliberate re-send with the same key runs.
    again = sender.send(workload.ticking, "long", 0.1)
    assert not again.options.get("duplicate")
    assert sender.wait_finished([again])[again.message_id].state == "succeeded"
    count = len(ticks(store, key, "long"))
    queue = sender.name(workload.ticking)
    assert sender.left_after_stop([worker], queue) == 0
    assert len(ticks(store, key, "long")) == count  # nothing ran after the re-send ended
    assert sender.depth(queue + ".DLQ") == 0 and record.attempts == 1
    # Stopped on purpose: logged as cancelled, not as a failure with a traceback.
    assert worker.events("job_cancelled", message_id=message.message_id)
    assert "Failed to process message" not in worker.output()


def test_a_cancelled_jobs_key_is_forgotten_before_its_outcome_is_written(sender, monkeypatch):
    """Deterministic half of the re-send check above: the key must be gone at the moment the
    ``JobCancelled`` result and the ``cancelled`` status are written, not a moment after."""
    broker = sender.broker
    (idempotency,) = [m for m in broker.middleware if isinstance(m, Idempotency)]
    (results,) = [m for m in broker.middleware if isinstance(m, StoreResults)]
    (status,) = [m for m in broker.middleware if isinstance(m, Status)]
    message = MessageProxy(sender.message(workload.ticking, "forgotten", 30))
    hashed = idempotency.key_of(broker, message)
    assert hashed is not None  # ticking's actor names a key
    idempotency.backend.register(hashed, message.message_id, 60_000)
    seen: dict[str, object] = {}
    store_exception, update = results.backend.store_exception, status._update
    monkeypatch.setattr(
        results.backend,
        "store_exception",
        lambda *a, **k: (
            seen.setdefault("result", idempotency.backend.lookup(hashed)),
            store_exception(*a, **k),
        ),
    )
    monkeypatch.setattr(
        status,
        "_update",
        lambda *a, **k: (seen.setdefault("status", idempotency.backend.lookup(hashed)), update(*a, **k)),
    )
    broker.emit_after("process_message", message, exception=JobCancelled())
    assert seen == {"result": None, "status": None}
    # Cancelled on arrival (skipped, never run): the same order.
    seen.clear()
    skipped = MessageProxy(sender.message(workload.ticking, "forgotten", 30))
    idempotency.backend.register(hashed, skipped.message_id, 60_000)
    skipped.options[CANCELLED] = True
    broker.emit_after("skip_message", skipped)
    assert seen == {"result": None, "status": None}


def test_a_cancelled_jobs_key_is_kept_when_the_store_refuses_to_forget_it(
    queues, prefix, monkeypatch, caplog
):
    """A Redis error reply while forgetting: the key stays (a re-send is a duplicate, never a
    second run), the job's outcome is still written, and the error is logged, not raised."""
    broker = sender_broker(prefix, TEST_REDIS_URL)
    (idempotency,) = [m for m in broker.middleware if isinstance(m, Idempotency)]
    (results,) = [m for m in broker.middleware if isinstance(m, StoreResults)]
    message = MessageProxy(queues.message(workload.ticking, "kept", 30))
    hashed = idempotency.key_of(broker, message)
    assert hashed is not None  # ticking's actor names a key
    idempotency.backend.register(hashed, message.message_id, 60_000)

    def refuse(**_: object) -> None:
        raise redis.exceptions.ReadOnlyError("You can't write against a read only replica.")

    monkeypatch.setattr(idempotency.backend, "_forget", refuse)
    broker.emit_after("process_message", message, exception=JobCancelled())
    assert idempotency.backend.lookup(hashed) is not None
    with pytest.raises(ResultFailure):  # the JobCancelled result was stored all the same
        results.backend.get_result(message, block=False)
    assert any(r.getMessage() == "cancelled_key_kept" for r in caplog.records)


def test_cancelling_a_delayed_job_before_it_is_due_means_it_never_starts(
    start_worker, sender, store, state_url, key
):
    start_worker(STATE_URL=state_url)
    message = sender.broker.enqueue(sender.message(workload.ticking, "later", 1), delay=1_500)
    cancel(message.message_id, broker=sender.broker)
    queued = wait_for(lambda: sender.status(message.message_id), what="the queued record")
    assert queued.state == "queued"  # cancelled before it was due
    record = sender.wait_finished([message])[message.message_id]
    assert record.state == "cancelled" and record.started_at is None
    assert ticks(store, key, "later") == []
    assert sender.depth(sender.name(workload.ticking) + ".DLQ") == 0


def test_a_job_that_is_not_interruptible_runs_to_its_end(start_worker, queues, store, key):
    start_worker()
    message = queues.send(workload.ticking_uninterruptible, "steady", 1.0)
    wait_for(lambda: ticks(store, key, "steady"), what="the job ticking")
    cancel(message.message_id, broker=queues.broker)
    assert queues.wait_finished([message])[message.message_id].state == "succeeded"
    assert store.exists(key("done:steady"))


def test_a_member_cancelled_while_it_runs_to_its_end_sends_no_next_step(start_worker, queues, store, key):
    """Not interruptible, it runs to its end after the cancel: its next step was sent all the same,
    as if nothing had been cancelled. The mark is in the store when its end is counted: the member
    counts as cancelled, the pipeline fails, and the next step is never sent."""
    worker = start_worker()
    first = queues.message(workload.gated, "g1")
    after = queues.message(workload.record, "after").copy(options={"pipe_ignore": True})
    flow = pipeline([first, after], broker=queues.broker).run()
    wait_for(lambda: store.exists(key("gated:g1")), what="the member running")
    assert cancel(first.message_id, broker=queues.broker) == [first.message_id]
    store.set(key("open:g1"), "1")  # the barrier: the member returns only now
    ended = wait_for(
        lambda: (f := recorded(queues, flow))["state"] != "running" and f,
        what="the pipeline's end",
    )
    assert ended["state"] == "failed" and ended["failed_member"]["id"] == first.message_id
    assert ended["failed_member"]["state"] == "cancelled"
    assert ended["steps"][1]["members"][0]["state"] == "waiting"
    assert queues.left_after_stop([worker], queues.name(workload.record)) == 0
    assert not store.sismember(key("tokens"), "after")


def test_a_step_of_a_cancelled_workflow_arriving_after_its_mark_expired_never_runs(
    start_worker, sender, store, state_url, key, monkeypatch
):
    """With ``JOB_STATUS=false`` a cancel's marks live ``CANCEL_TTL_MS`` whatever the delay of the
    step they stop: a pipeline's next step, delayed longer, arrived with no mark left at a worker
    (restarted meanwhile, so its poller never saw the mark either) and ran, under a workflow
    recorded cancelled. The workflow's record stops it for as long as it exists."""
    env = {"STATE_URL": state_url, "JOB_STATUS": "false", "CANCEL_TTL_MS": "1000"}
    first_worker = start_worker(**env)
    workflows = find_workflows(sender.broker)
    monkeypatch.setattr(workflows, "cancel_ttl_ms", 1_000)  # the sender's CANCEL_TTL_MS
    after = sender.message(workload.record, "after").copy(options={"pipe_ignore": True, "delay": 6_000})
    flow = pipeline([sender.message(workload.record, "first"), after], broker=sender.broker).run()
    wait_for(
        lambda: first_worker.events("workflow_step_sent", workflow_id=flow.workflow_id),
        what="the delayed step sent",
    )
    assert cancel(launched(flow), broker=sender.broker) == [after.message_id]
    assert first_worker.stop() == 0  # the step, still delayed, handed back for the next worker
    mark = (after.message_id, launched(flow))  # the workflow's cancel marks it as its member
    wait_for(lambda: not workflows.marks.cancelled_among([mark]), what="the mark's expiry")
    second_worker = start_worker(**env)
    wait_for(lambda: member_state(sender, launched(flow), 1) != "waiting", what="the step counted")
    assert member_state(sender, launched(flow), 1) == "cancelled"
    assert flow_state(sender, launched(flow)) == "cancelled"
    assert second_worker.events("job_cancelled", message_id=after.message_id)  # skipped, never started
    assert sender.left_after_stop([second_worker], sender.name(workload.record)) == 0
    assert store.smembers(key("tokens")) == {"first"}


def test_cancelling_one_workflow_leaves_the_same_message_in_another_to_complete(
    start_worker, sender, store, state_url, key
):
    """One message (one message id) in two groups, both delayed: the cancel of one marked the
    message by id, and the copy in the group nobody cancelled was skipped too. Now the cancelled
    group's copy is skipped and the other group's runs, and that group succeeds."""
    worker = start_worker(STATE_URL=state_url)
    shared = sender.message(workload.record, "shared")
    stopped = group([shared], broker=sender.broker).run(delay=1_500)
    running = group([shared], broker=sender.broker).run(delay=1_500)
    assert cancel(launched(stopped), broker=sender.broker) == [shared.message_id]
    wait_for(lambda: flow_state(sender, launched(running)) == "succeeded", what="the other group's end")
    wait_for(lambda: member_state(sender, launched(stopped), 0) == "cancelled", what="the skip counted")
    assert flow_state(sender, launched(stopped)) == "cancelled"
    assert member_state(sender, launched(running), 0) == "succeeded"
    assert worker.events("job_cancelled", message_id=shared.message_id)  # the cancelled copy, skipped
    assert sender.left_after_stop([worker], sender.name(workload.record)) == 0
    assert store.smembers(key("tokens")) == {"shared"} and store.get(key("count:record")) == "1"


def test_cancelling_one_workflow_interrupts_its_running_copy_only(
    start_worker, sender, store, state_url, key
):
    """Both copies of one message run at once, as members of two groups: the cancel of one group
    interrupts its copy only (``slow`` sleeps in one call: the interrupt lands as it returns, before
    it notes its end), the other copy ends, counted succeeded, and its group succeeds."""
    worker = start_worker(STATE_URL=state_url)
    shared = sender.message(workload.slow, "both", 3.0)
    stopped = group([shared], broker=sender.broker).run()
    running = group([shared], broker=sender.broker).run()
    wait_for(lambda: store.llen(key("started:both")) == 2, what="both copies running")
    assert cancel(launched(stopped), broker=sender.broker) == [shared.message_id]
    wait_for(lambda: flow_state(sender, launched(running)) == "succeeded", what="the other group's end")
    wait_for(lambda: member_state(sender, launched(stopped), 0) == "cancelled", what="the interrupt counted")
    assert flow_state(sender, launched(stopped)) == "cancelled"
    interrupts = worker.events("job_interrupted", message_id=shared.message_id)  # the poller's, one job's end
    assert [e["logger"] for e in interrupts].count("jobsystem.runtime.cancellation") == 1
    assert store.llen(key("finished:both")) == 1  # the running group's copy alone ran to its end
    assert sender.left_after_stop([worker], sender.name(workload.slow)) == 0


def test_jobctl_cancels_a_workflow_and_shows_its_steps(start_worker, queues, store, prefix, key):
    start_worker()
    members = [queues.message(workload.ticking, f"w{i}", 30) for i in range(2)]
    callback = queues.message(workload.total)
    chord = pipeline([group(members), callback], broker=queues.broker).run()
    wait_for(lambda: all(ticks(store, key, f"w{i}") for i in range(2)), what="both members ticking")
    result = jobctl(prefix, "cancel", launched(chord))
    assert result.returncode == 0, result.stderr
    assert "cancelled 3 job(s)" in result.stdout
    # The running members are stopped; the callback, not sent yet, is named as having no record.
    assert result.stdout.splitlines()[1:] == [
        f"  no status record (unknown, or not recorded yet: skipped if it arrives): {callback.message_id}"
    ]
    queues.wait_finished(members)
    # A job that has finished, and an id nothing knows: marked, and named as such.
    again = jobctl(prefix, "cancel", members[0].message_id, "no-such-job")
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == [
        "cancelled 2 job(s)",
        f"  already finished, nothing to stop: {members[0].message_id} (cancelled)",
        "  no status record (unknown, or not recorded yet: skipped if it arrives): no-such-job",
    ]

    shown = jobctl(prefix, "status", launched(chord), "--json")
    assert shown.returncode == 0, shown.stderr
    flow = json.loads(shown.stdout)
    assert flow["state"] == "cancelled" and flow["kind"] == "chord"
    assert [m["state"] for m in flow["steps"][0]["members"]] == ["cancelled", "cancelled"]
    assert flow["steps"][1]["members"][0]["actor"] == "total"
    text = jobctl(prefix, "status", launched(chord))
    assert text.returncode == 0 and "state      cancelled" in text.stdout and "step 1" in text.stdout
    assert store.llen(key("total")) == 0
