"""How long a workflow's records and marks live: past their TTL for a delayed workflow, step or job
scheduled later or a member re-enqueued with a delay (a retry), with the record for a step's finished
members, and no rows left in SQLite."""

from __future__ import annotations

import logging
import time
from typing import Any

import dramatiq
from dramatiq import Message

from jobsystem.store import StateStore
from jobsystem.store.redis import RedisStore
from jobsystem.store.workflows import workflow_backend
from jobsystem.workflows import mark_ttl_ms
from middleware.status import Status
from middleware.workflows import Workflows
from tests.unit.stub import RecordingBroker, delivery
from tests.unit.workflow_brokers import TTL, chord, workflow_broker


def test_a_delayed_workflow_and_a_delayed_step_keep_their_record_past_its_ttl(store):
    """The record lives the workflow's TTL after its last change: a launch, or a next step, delayed
    longer would find it gone (a chord's callback never sent, a cancel that misses the members)."""
    from jobsystem.workflows import pipeline as workflow_pipeline

    broker, workflows, square, total = workflow_broker(store)
    workflows.ttl_ms = 200
    steps = [square.message(2), total.message_with_options(delay=600)]
    flow = workflow_pipeline(steps, broker=broker).run(delay=600)
    time.sleep(0.4)  # past the TTL, within the delay
    assert workflows.backend.get(str(flow.workflow_id)) is not None
    workflows.after_process_message(broker, delivery(broker.enqueued[0][0]), result=4)
    time.sleep(0.4)
    (_, delay) = broker.enqueued[1]
    assert delay == 600 and workflows.backend.get(str(flow.workflow_id)) is not None
    workflows.after_process_message(broker, delivery(broker.enqueued[1][0]), result=None)
    found = workflows.backend.get(str(flow.workflow_id))
    assert found is not None and found.state == "succeeded"


def test_a_mark_on_a_job_scheduled_past_its_ttl_lives_until_the_job_is_due(store):
    status = Status(store, scheduled_after_ms=30_000)
    broker = RecordingBroker(middleware=[status])
    actor = dramatiq.actor(broker=broker, actor_name="job", queue_name="q")(lambda: None)
    month, now = actor.message(), actor.message()
    eta = int(time.time() * 1000) + 30 * 86_400_000
    status.after_enqueue(broker, month.copy(queue_name="q.DQ", options={"eta": eta}), 30 * 86_400_000)
    assert status.flush(10)
    try:
        before = int(time.time() * 1000)
        ttl = mark_ttl_ms(broker, [month.message_id, now.message_id], TTL)
        assert abs(before + ttl - (eta + TTL)) < 1_000  # the mark outlives the due time by TTL
        assert mark_ttl_ms(broker, [now.message_id], TTL) == TTL
        assert mark_ttl_ms(RecordingBroker(middleware=[]), [month.message_id], TTL) == TTL
    finally:
        status.writes.stop()


def test_a_step_member_ending_early_keeps_the_record_for_a_member_delayed_past_its_ttl(store):
    """A step whose members have different delays: the first to end refreshed the record's TTL
    from its own end, so a sibling delayed longer than the TTL found it gone (the step never
    completed, the chord's callback never sent). Ending a member never shortens the record."""
    from jobsystem.workflows import group as workflow_group
    from jobsystem.workflows import pipeline as workflow_pipeline

    broker, workflows, square, total = workflow_broker(store)
    workflows.ttl_ms = 200
    fan_out = workflow_group(
        [square.message_with_options(args=(2,), delay=600), square.message(3)], broker=broker
    )
    flow = workflow_pipeline([square.message(1), fan_out, total.message()], broker=broker).run()
    workflows.after_process_message(broker, delivery(broker.enqueued[0][0]), result=1)
    (late, late_delay), (early, _) = broker.enqueued[1:3]
    assert late_delay == 600
    workflows.after_process_message(broker, delivery(early), result=9)  # ends at once
    time.sleep(0.45)  # past the TTL after the early member's end, within the late one's delay
    workflows.after_process_message(broker, delivery(late), result=4)
    assert [(m.actor_name, m.args) for m, _ in broker.enqueued[3:]] == [("total", ([4, 9],))]
    found = workflows.backend.get(str(flow.workflow_id))
    assert found is not None and found.state == "running"


def test_a_steps_finished_members_expire_with_the_record(store):
    backend = workflow_backend(store)
    record, members = chord(store)
    backend.finish(record["id"], 0, members[0], "succeeded", "0", TTL)
    if isinstance(store, RedisStore):
        key = store.key(f"wf:{record['id']}")
        assert 0 < store.client.pttl(f"{key}:done:0") <= store.client.pttl(key) + 1_000


def test_an_expired_workflow_leaves_no_rows_in_sqlite(tmp_path):
    """Redis forgets an expired workflow; SQLite kept every row of every workflow ever run (each
    member's state and result, up to 64 KiB), and the file grew without end."""
    from jobsystem.store.sqlite import SqliteStore

    store = SqliteStore(tmp_path / "state.db")
    backend = workflow_backend(store)
    old = {"id": "old", "kind": "group", "steps": [{"mode": "success", "members": [{"id": "m0"}]}]}
    backend.create(old, 50)
    backend.finish("old", 0, "m0", "succeeded", '"a result"', 50)
    time.sleep(0.1)
    backend.create({**old, "id": "new"}, TTL)  # a new workflow sweeps the expired ones
    with store.transaction() as conn:
        left = [conn.execute(f"SELECT wid FROM {t}").fetchall() for t in ("workflow_fields", "workflow_done")]
    assert {wid for rows in left for (wid,) in rows} == {store.key("new")}
    store.close()


def _mail_group(store: StateStore, ttl_ms: int) -> tuple[RecordingBroker, Workflows, list[Message[Any]]]:
    """A group mailing ana and bob with an ``on_finish`` summary, launched; its members as sent."""
    from jobsystem.workflows import group as workflow_group

    workflows = Workflows(store, ttl_ms=ttl_ms, cancel_ttl_ms=TTL)
    broker = RecordingBroker(middleware=[workflows])
    mail = dramatiq.actor(broker=broker, actor_name="mail", queue_name="q")(lambda to: None)
    summary = dramatiq.actor(broker=broker, actor_name="summary", queue_name="q")(lambda counts: None)
    fan_out = workflow_group([mail.message("ana"), mail.message("bob")], broker=broker)
    fan_out.on_finish(summary.message_with_options())
    fan_out.run()
    return broker, workflows, [m for m, _ in broker.enqueued]


def test_a_group_member_retried_past_the_workflows_ttl_still_finishes_the_group(store):
    """A member's delayed re-enqueue (a retry, ``Retry(delay=...)``, a deferral) did not lengthen
    its workflow's record, which lives the TTL after its last change: a member retried past it
    found the workflow gone (``finish`` answered ``unknown``) and ``on_finish`` never ran."""
    broker, workflows, (ana, bob) = _mail_group(store, ttl_ms=200)
    workflows.after_process_message(broker, delivery(ana), result=None)
    retry = bob.copy(options={"retries": 1})
    broker.enqueue(retry, delay=3_000)  # as SafeRetries re-enqueues a failed attempt
    time.sleep(0.5)  # past the TTL after ana's end, well within the retry's delay: it runs now
    workflows.after_process_message(broker, delivery(retry), result=None)
    sent = [(m.actor_name, m.args) for m, _ in broker.enqueued]
    assert ("summary", ({"succeeded": 2, "dead": 0, "cancelled": 0},)) in sent


def test_a_member_whose_workflow_is_gone_is_logged_at_warning(store, caplog):
    broker, workflows, (ana, _) = _mail_group(store, ttl_ms=50)
    time.sleep(0.1)  # the record expired
    with caplog.at_level(logging.INFO, logger="middleware.workflows"):
        workflows.after_process_message(broker, delivery(ana), result=None)
    gone = [r for r in caplog.records if r.getMessage() == "workflow_gone"]
    assert [r.levelno for r in gone] == [logging.WARNING]
