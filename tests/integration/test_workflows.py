"""Workflows and cancellation end to end: results, pipelines, chords (a member killed mid-run, a
member dead-lettered), cancelling running and delayed jobs, and ``jobctl status``/``cancel``."""

from __future__ import annotations

import json

import pytest
from dramatiq.results import ResultFailure

from actors.workflows import group, pipeline, workflow_status
from tests import workload
from tests.integration.workflow_support import (
    flow_state,
    jobctl,
    launched,
    recorded,
    run_backend,
)
from tests.support import wait_for


def test_pipeline_pipes_each_result_into_the_next_step(start_worker, sender, state_url):
    start_worker(STATE_URL=state_url)
    steps = [
        sender.message(workload.add, 1, 2),
        sender.message(workload.add, 10),
        sender.message(workload.add, 100),
    ]
    run = pipeline(steps, broker=sender.broker).run()
    assert run.get_result(block=True, timeout=30_000) == 113
    assert steps[0].get_result(backend=run_backend(sender), block=True) == 3
    flow = wait_for(
        lambda: (
            flow_state(sender, launched(run)) == "succeeded"
            and workflow_status(launched(run), broker=sender.broker)
        )
    )
    assert flow["kind"] == "pipeline"
    assert [m["state"] for s in flow["steps"] for m in s["members"]] == ["succeeded"] * 3


def test_a_failed_job_result_raises_its_error(start_worker, sender, state_url):
    start_worker(STATE_URL=state_url)
    message = sender.send_with_options(workload.permanent, args=("ana@example.com",), store_results=True)
    with pytest.raises(ResultFailure) as failure:
        message.get_result(backend=run_backend(sender), block=True, timeout=30_000)
    assert failure.value.orig_exc_type == "Permanent"


def test_group_results_and_completion_callback(start_worker, sender, store, state_url, key):
    start_worker(STATE_URL=state_url)
    members = group([sender.message(workload.square, i) for i in range(4)], broker=sender.broker)
    members.add_completion_callback(sender.message(workload.total, [-1]))
    members.run()
    assert list(members.get_results(block=True, timeout=30_000)) == [0, 1, 4, 9]
    wait_for(lambda: store.llen(key("total")) == 1, what="the completion callback")
    assert json.loads(store.lindex(key("total"), 0)) == [-1]  # a callback gets no results


def test_chord_runs_the_next_step_once_with_results_in_order_despite_a_sigkill(
    start_worker, queues, store, key
):
    first = start_worker(threads=4)
    members = [queues.message(workload.square, i, hold=(i == 3)) for i in range(5)]
    callback = queues.message(workload.total)
    chord = pipeline([group(members), callback], broker=queues.broker).run()
    wait_for(lambda: store.exists(key("holding:3")), what="member 3 running")
    first.kill()  # SIGKILL while member 3 runs: RabbitMQ redelivers it
    first.proc.wait(10)
    second = start_worker(threads=4)
    assert chord.get_result(block=True, timeout=60_000) == 30
    assert wait_for(lambda: flow_state(queues, launched(chord)) == "succeeded")
    assert queues.left_after_stop([second], queues.name(workload.square)) == 0
    assert [json.loads(r) for r in store.lrange(key("total"), 0, -1)] == [[0, 1, 4, 9, 16]]
    assert store.llen(key("square:3")) == 2  # killed mid-run, then run again


def test_chord_with_a_dead_lettered_member_never_runs_its_next_step(start_worker, queues, store, key):
    worker = start_worker()
    members = [
        queues.message(workload.square, 1),
        queues.message(workload.square_fails, 2),
        queues.message(workload.square, 3),
    ]
    callback = queues.message(workload.total)
    chord = pipeline([group(members), callback], broker=queues.broker).run()

    def ended():
        flow = recorded(queues, chord)
        states = [m["state"] for m in flow["steps"][0]["members"]]
        # The member states may come from the job status records a moment before the workflow's
        # own count: wait for both.
        return flow if states == ["succeeded", "dead", "succeeded"] and flow["state"] != "running" else None

    flow = wait_for(ended, what="every member's end")
    assert flow["state"] == "failed"
    assert flow["failed_member"]["id"] == members[1].message_id
    assert flow["failed_member"]["actor"] == "square_fails" and flow["failed_member"]["state"] == "dead"
    assert flow["steps"][1]["members"][0]["state"] == "waiting"
    assert queues.left_after_stop([worker], queues.name(workload.total)) == 0
    assert store.llen(key("total")) == 0
    assert queues.depth(queues.name(workload.square_fails) + ".DLQ") == 1


def test_chord_member_with_a_result_too_large_fails_the_chord_with_the_reason(
    start_worker, queues, store, prefix, key
):
    """Its result (over 64 KiB as JSON) cannot be kept: the callback was sent ``[1, None]`` as if
    the member had returned None. Now the member fails the chord, and the status says why."""
    worker = start_worker()
    members = [queues.message(workload.square, 1), queues.message(workload.sized, 70_000)]
    chord = pipeline([group(members), queues.message(workload.total)], broker=queues.broker).run()
    flow = wait_for(
        lambda: (f := recorded(queues, chord))["state"] != "running" and f,
        what="the chord's end",
    )
    assert flow["state"] == "failed"
    reason = "result too large: 70002 bytes > 65536"
    assert flow["failed_member"] == {
        "id": members[1].message_id,
        "actor": "sized",
        "queue": queues.name(workload.sized),
        "state": "failed",
        "reason": reason,
    }
    assert flow["steps"][1]["members"][0]["state"] == "waiting"
    shown = jobctl(prefix, "status", launched(chord))
    assert shown.returncode == 0 and f"sized  failed  ({reason})" in shown.stdout
    assert queues.left_after_stop([worker], queues.name(workload.total)) == 0
    assert store.llen(key("total")) == 0
