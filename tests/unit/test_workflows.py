"""Workflows and cancellation in process, on both store backends: member ends counted once, the
next step sent once with the results in order, cancellation marks, the results backend, and the
faults (a store that errs on arrival defers the message)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import dramatiq
import pytest
from dramatiq.middleware import SkipMessage
from dramatiq.results import ResultFailure

from jobsystem.runtime.cancellation import CANCELLED, CancelWatch, JobCancelled
from jobsystem.runtime.workflow_steps import WORKFLOW, Step, annotate
from jobsystem.store import StateStore, StoreUnavailable
from jobsystem.store.cancel_marks import Mark, cancel_marks
from jobsystem.store.idempotency import idempotency_backend
from jobsystem.store.redis import RedisStore
from jobsystem.store.results import StoreResultBackend
from jobsystem.store.workflows import RedisWorkflows, workflow_backend
from jobsystem.workflows import mark_ttl_ms
from middleware.cancellation import Cancellation
from middleware.status import Status
from middleware.workflows import Workflows
from tests.unit.stub import RecordingBroker, delivery

TTL = 60_000


def chord(store: StateStore, size: int = 3, mode: str = "success") -> tuple[dict[str, Any], list[str]]:
    record = {
        "id": f"wf{size}{mode}",
        "kind": "chord",
        "steps": [
            {"mode": mode, "members": [{"id": f"m{i}", "actor": "a", "queue": "q"} for i in range(size)]},
            {"mode": "success", "members": [{"id": "next", "actor": "b", "queue": "q"}]},
        ],
    }
    workflow_backend(store).create(record, TTL)
    return record, [f"m{i}" for i in range(size)]


def test_a_member_is_counted_once_and_the_step_completes_once(store):
    backend = workflow_backend(store)
    record, members = chord(store)
    answers = [
        backend.finish(record["id"], 0, m, "succeeded", str(i * i), TTL) for i, m in enumerate(members)
    ]
    again = backend.finish(record["id"], 0, "m1", "succeeded", "1", TTL)  # a duplicate delivery
    assert [(a.added, a.complete) for a in answers] == [(True, False), (True, False), (True, True)]
    assert (again.added, again.finished, again.state) == (False, 3, "running")
    found = backend.get(record["id"])
    assert found is not None and found.step_results(0) == [0, 1, 4]
    last = backend.finish(record["id"], 1, "next", "succeeded", "5", TTL)
    assert last.complete and last.state == "succeeded"


def test_only_the_member_that_completed_the_step_may_send_it_again(store):
    backend = workflow_backend(store)
    record, members = chord(store)
    answers = [backend.finish(record["id"], 0, m, "succeeded", "0", TTL) for m in members]
    assert [(a.send_next, a.completer) for a in answers] == [(False, False), (False, False), (True, True)]
    other = backend.finish(record["id"], 0, "m0", "succeeded", "0", TTL)  # redelivered
    again = backend.finish(record["id"], 0, "m2", "succeeded", "0", TTL)  # the completer's delivery again
    assert (other.complete, other.completer, other.send_next) == (True, False, False)
    assert (again.completer, again.send_next) == (True, True)
    backend.mark_sent(record["id"], 0, TTL)
    assert not backend.finish(record["id"], 0, "m2", "succeeded", "0", TTL).send_next


def test_marking_a_step_sent_of_an_expired_workflow_records_nothing(store):
    # Redis: HSET made the expired workflow's hash anew, and PEXPIRE GT gave it no TTL: for ever.
    backend = workflow_backend(store)
    record, _ = chord(store)
    key = backend._key(record["id"]) if isinstance(backend, RedisWorkflows) else None
    if key is not None:
        store.client.delete(key)  # as its TTL would
    workflow_id = record["id"] if key is not None else "expired-or-unknown"
    backend.mark_sent(workflow_id, 0, TTL)
    assert backend.get(workflow_id) is None
    if key is not None:
        assert store.client.exists(key) == 0


def test_a_step_completed_before_the_completer_was_recorded_may_be_sent_by_any_member(store):
    # A workflow in flight across the upgrade: its step completed without ``by:<step>``.
    backend = workflow_backend(store)
    record, members = chord(store)
    for m in members:
        backend.finish(record["id"], 0, m, "succeeded", "0", TTL)
    if isinstance(store, RedisStore):
        store.client.hdel(store.key(f"wf:{record['id']}"), "by:0")
    else:
        with store.transaction() as conn:
            conn.execute("DELETE FROM workflow_fields WHERE field = 'by:0'")
    assert backend.finish(record["id"], 0, "m0", "succeeded", "0", TTL).send_next


def test_a_member_that_did_not_succeed_fails_the_chord_and_is_named(store):
    backend = workflow_backend(store)
    record, _ = chord(store)
    backend.finish(record["id"], 0, "m0", "succeeded", "0", TTL)
    failed = backend.finish(record["id"], 0, "m1", "dead", "null", TTL)
    done = backend.finish(record["id"], 0, "m2", "succeeded", "4", TTL)
    assert failed.state == "failed" and done.complete and done.state == "failed"
    found = backend.get(record["id"])
    assert found is not None and found.failed == "m1" and found.states["m1"] == "dead"


def test_a_finish_step_counts_what_ended_how(store):
    backend = workflow_backend(store)
    record, _ = chord(store, 3, "finished")
    backend.finish(record["id"], 0, "m0", "succeeded", "0", TTL)
    backend.finish(record["id"], 0, "m1", "dead", "null", TTL)
    done = backend.finish(record["id"], 0, "m2", "succeeded", "4", TTL)
    assert done.complete and done.state == "running"
    assert done.counts == {"succeeded": 2, "dead": 1, "cancelled": 0}


def test_an_unknown_workflow_is_answered_not_created(store):
    backend = workflow_backend(store)
    progress = backend.finish("nope", 0, "m0", "succeeded", "0", TTL)
    assert progress.state == "unknown" and not progress.complete
    assert backend.get("nope") is None


def test_cancellation_marks_are_read_in_one_call_and_expire(store):
    backend = cancel_marks(store)
    backend.mark_cancelled(["a", "b"], TTL)
    backend.mark_cancelled(["short"], 50)
    assert backend.cancelled_among(["a", "x", "b", "short"]) == {"a", "b", "short"}
    time.sleep(0.1)
    assert backend.cancelled_among(["a", "short"]) == {"a"}
    assert backend.cancelled_among([]) == set()


def test_a_poller_reads_the_marks_made_since_a_time(store):
    backend = cancel_marks(store)
    backend.mark_cancelled(["a"], TTL)
    marks, now = backend.cancelled_since(0)
    assert set(marks) == {"a"} and marks["a"] <= now
    backend.mark_cancelled(["b"], TTL)
    later, _ = backend.cancelled_since(now + 1)
    assert set(later) <= {"b"}  # "a" is older (b may share a's millisecond on a fast store)
    assert set(backend.cancelled_since(now - 1_000)[0]) == {"a", "b"}


def test_a_mark_made_after_a_wait_for_the_sqlite_write_lock_is_dated_after_it(tmp_path):
    """A mark dated before its wait for the lock (up to the busy timeout, longer than the pollers'
    overlap) could fall behind a poll made meanwhile, and never be seen."""
    import sqlite3

    from jobsystem.store.sqlite import SqliteStore

    store = SqliteStore(tmp_path / "state.db")
    backend = cancel_marks(store)
    blocker = sqlite3.connect(tmp_path / "state.db", isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    released = threading.Timer(0.5, blocker.execute, ("COMMIT",))
    released.start()
    asked = store.now_ms()
    backend.mark_cancelled(["late"], TTL)
    released.join()
    marks, _ = backend.cancelled_since(asked + 400)
    assert "late" in marks  # dated once the lock was taken, ~0.5 s after it was asked for
    store.close()


def test_a_workflow_moves_to_cancelled_only_while_it_runs(store):
    backend = workflow_backend(store)
    record, _ = chord(store)
    assert backend.set_state(record["id"], "cancelled")
    assert not backend.set_state(record["id"], "cancelled")
    progress = backend.finish(record["id"], 0, "m0", "succeeded", "0", TTL)
    assert progress.state == "cancelled"


def test_forgetting_a_key_keeps_a_completed_one(store):
    keys = idempotency_backend(store)
    keys.register_many([("pending", "m1", TTL), ("done", "m2", TTL)])
    keys.complete_many([("done", '"ok"', TTL)])
    keys.forget_many(["pending", "done"])
    assert keys.lookup("pending") is None
    record = keys.lookup("done")
    assert record is not None and record.state == "done"


def test_results_are_kept_and_errors_stored_scrubbed(store):
    broker = RecordingBroker()
    actor = dramatiq.actor(broker=broker, actor_name="job", queue_name="q")(lambda: None)
    backend = StoreResultBackend(store, scrub=lambda text: text.replace("ana@example.com", "[email]"))
    ok, failed = actor.message(), actor.message()
    backend.store_result(ok, {"n": 1}, TTL)
    backend.store_exception(failed, ValueError("no mail for ana@example.com"), TTL)
    assert backend.get_result(ok) == {"n": 1}
    with pytest.raises(ResultFailure, match=r"ValueError: no mail for \[email\]"):
        backend.get_result(failed)
    assert not backend.has_result(actor.message())


def workflow_broker(store: StateStore) -> tuple[RecordingBroker, Workflows, Any, Any]:
    workflows = Workflows(store, ttl_ms=TTL, cancel_ttl_ms=TTL)
    broker = RecordingBroker(middleware=[workflows])
    square = dramatiq.actor(broker=broker, actor_name="square", queue_name="q")(lambda i: i * i)
    total = dramatiq.actor(broker=broker, actor_name="total", queue_name="q")(lambda results: sum(results))
    return broker, workflows, square, total


def square_chord(
    store: StateStore, members: int = 2
) -> tuple[RecordingBroker, Workflows, dict[str, Any], list[Any]]:
    """A chord of ``members`` squares piped as a list into ``total``, created in the store: the
    broker, the middleware, the record and the first step's messages."""
    broker, workflows, square, total = workflow_broker(store)
    record, first = annotate(
        "chord", [Step([square.message(i) for i in range(members)], pipe="list"), Step([total.message()])]
    )
    workflows.backend.create(record, TTL)
    return broker, workflows, record, first


def test_the_last_member_sends_the_next_step_once_with_the_results_in_order(store):
    broker, workflows, _, first = square_chord(store, members=3)
    for i in (2, 0, 1, 1):  # out of order, and member 1 delivered twice
        workflows.after_process_message(broker, delivery(first[i]), result=i * i)
    (sent, delay), *more = broker.enqueued
    assert more == [] and delay is None
    assert sent.actor_name == "total" and sent.args == ([0, 1, 4],)
    assert sent.options["idempotency_key"] == f"workflow-step:{sent.message_id}"
    assert sent.options[WORKFLOW]["step"] == 1


def test_a_dead_member_never_sends_the_next_step(store):
    broker, workflows, record, first = square_chord(store)
    workflows.after_process_message(broker, delivery(first[0]), result=0)
    dead = delivery(first[1])
    dead.fail()
    workflows.after_nack(broker, dead)
    assert broker.enqueued == []
    found = workflows.backend.get(record["id"])
    assert found is not None and (found.state, found.failed) == ("failed", first[1].message_id)


def test_a_dead_member_the_store_could_not_count_is_counted_once_it_answers(store):
    broker, workflows, record, first = square_chord(store)
    workflows.dead_retry_s = 0.05
    answer = workflows.backend.finish
    refusals = iter([StoreUnavailable("redis: ResponseError: OOM"), StoreUnavailable("redis: timeout")])

    def flaky(*args: Any, **kwargs: Any) -> Any:
        refusal = next(refusals, None)
        if refusal is not None:
            raise refusal
        return answer(*args, **kwargs)

    workflows.backend.finish = flaky  # type: ignore[method-assign]
    dead = delivery(first[1])
    dead.fail()
    workflows.after_nack(broker, dead)  # refused twice, then counted in the background
    wait_until(lambda: (found := workflows.backend.get(record["id"])) is not None and found.state == "failed")
    found = workflows.backend.get(record["id"])
    assert found is not None and found.failed == first[1].message_id and broker.enqueued == []


def test_a_store_down_when_counting_puts_the_delivery_back(store):
    from jobsystem.dramatiq_internals import wants_redelivery

    broker, workflows, square, _ = workflow_broker(store)
    _, first = annotate("group", [Step([square.message(1)], pipe="list")])

    def down(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("down")

    workflows.backend.finish = down  # type: ignore[method-assign]
    message = delivery(first[0])
    workflows.after_process_message(broker, message, result=1)
    assert wants_redelivery(message)


def cancellation_broker(store: StateStore) -> tuple[RecordingBroker, Cancellation, Any]:
    cancellation = Cancellation(store, keep_ms=TTL, poll_interval=0.05)
    broker = RecordingBroker(middleware=[cancellation])
    job = dramatiq.actor(broker=broker, actor_name="job", queue_name="q")(lambda: None)
    return broker, cancellation, job


def test_a_cancelled_message_is_skipped_on_arrival_asking_the_store_until_the_poller_is_up(store):
    broker, cancellation, job = cancellation_broker(store)
    message = job.message()
    cancellation.backend.mark_cancelled([message.message_id], TTL)
    asked: list[Mark] = []
    exact = cancellation.backend.cancelled_among

    def asking(marks: Sequence[Mark]) -> set[Mark]:
        asked.extend(marks)
        return exact(marks)

    cancellation.backend.cancelled_among = asking  # type: ignore[method-assign]
    arrived = delivery(message)
    with pytest.raises(SkipMessage, match="cancelled"):
        cancellation.before_process_message(broker, arrived)
    assert arrived.options[CANCELLED] is True and broker.enqueued == []
    wait_until(lambda: cancellation.watch.known("x") is not None)
    asked.clear()
    with pytest.raises(SkipMessage, match="cancelled"):  # the poller knows: no store call
        cancellation.before_process_message(broker, delivery(message))
    cancellation.before_process_message(broker, delivery(job.message()))  # not marked: runs
    assert asked == []
    cancellation.watch.stop()


def wait_until(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_message_older_than_the_pollers_memory_is_checked_against_the_store(store):
    broker, cancellation, job = cancellation_broker(store)
    wait_until(lambda: cancellation.watch.known("x") is not None)
    # Sent a month ago, cancelled then with a mark that lives until it is due: the poller has
    # forgotten the mark (it keeps marks for TTL), the store has not.
    month_old = job.message().copy(message_timestamp=int(time.time() * 1000) - 30 * 86_400_000)
    cancellation.backend.mark_cancelled([month_old.message_id], 31 * 86_400_000)
    cancellation.watch._marks.pop(month_old.message_id, None)
    assert cancellation.watch.known(month_old.message_id) is False
    with pytest.raises(SkipMessage, match="cancelled"):
        cancellation.before_process_message(broker, delivery(month_old))
    cancellation.watch.stop()


def test_a_store_that_errs_on_arrival_defers_the_message(store, caplog):
    broker, cancellation, job = cancellation_broker(store)

    def down(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("redis: ResponseError: OOM command not allowed")

    # The poller cannot read the marks, so the arrival asks the store, which errs: deferred, as a
    # store that is down (a warning), not as a guard that failed unexpectedly (an error).
    cancellation.backend.cancelled_among = down  # type: ignore[method-assign]
    cancellation.watch.cancelled_since = down
    with pytest.raises(SkipMessage, match="deferred: store_unavailable"):
        cancellation.before_process_message(broker, delivery(job.message()))
    (copy, delay), *_ = broker.enqueued
    assert delay is not None and delay > 0 and copy.options["cancellation_store_waits"] == 1
    assert "cancellation_store_unavailable" in [r.msg for r in caplog.records if r.levelname == "WARNING"]
    assert "guard_failed" not in caplog.text
    cancellation.watch.stop()


def test_a_running_job_is_interrupted_and_one_that_ended_is_not(store):
    backend = cancel_marks(store)
    running = CancelWatch(backend.cancelled_since, keep_ms=TTL, interval=0.05)
    running.start()
    outcome: dict[str, Any] = {}
    started = threading.Event()

    def job() -> None:
        running.started("long")
        started.set()
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                time.sleep(0.01)
            outcome["ran_out"] = True
        except JobCancelled:
            outcome["cancelled_at"] = time.monotonic()
        finally:
            running.ended("long")

    worker = threading.Thread(target=job)
    worker.start()
    started.wait(5)
    running.started("other")
    running.ended("other")  # ended before its mark: never interrupted
    marked_at = time.monotonic()
    backend.mark_cancelled(["long", "other"], TTL)
    worker.join(10)
    running.stop()
    assert "ran_out" not in outcome and outcome["cancelled_at"] - marked_at < 1.0
    assert running.poll_once() == []


def test_a_cancel_after_the_actor_returned_is_not_raised_into_the_after_hooks(store):
    """ForgetCancelledKeys' after hook runs first: from then on a cancel cannot interrupt the
    others (a workflow's next step half sent), though Cancellation's own hook runs last."""
    from middleware.cancellation import ForgetCancelledKeys

    cancellation, first_after = Cancellation(store, keep_ms=TTL, poll_interval=60), ForgetCancelledKeys()
    broker = RecordingBroker(middleware=[cancellation, first_after])
    job = dramatiq.actor(broker=broker, actor_name="job", queue_name="q")(lambda: None)
    message = delivery(job.message())
    cancellation.before_process_message(broker, message)  # running, on this thread
    first_after.after_process_message(broker, message, result=None)
    cancellation.backend.mark_cancelled([message.message_id], TTL)
    assert cancellation.watch.poll_once() == []
    cancellation.after_process_message(broker, message, result=None)
    cancellation.watch.stop()


def test_an_arrival_is_registered_as_running_only_when_known_unmarked_and_asked(store):
    backend = cancel_marks(store)
    watch = CancelWatch(backend.cancelled_since, keep_ms=TTL, interval=60)
    backend.mark_cancelled(["marked"], TTL)
    wait_until(lambda: watch.known("x") is not None)  # the poller's first poll is in
    outcome: dict[str, Any] = {}
    arrived = threading.Event()

    def job() -> None:
        outcome["answer"] = watch.arrived("runs", start=True)
        arrived.set()
        try:  # short sleeps: the interrupt lands between two of them, not after 10 s
            for _ in range(1000):
                time.sleep(0.01)
        except JobCancelled:
            outcome["interrupted"] = True

    worker = threading.Thread(target=job)
    worker.start()
    arrived.wait(5)
    assert watch.arrived("confirmed", start=False) is False  # known, not registered
    assert watch.arrived("marked", start=True) is True  # cancelled: not registered
    backend.mark_cancelled(["runs", "confirmed"], TTL)
    assert watch.poll_once() == ["runs"]
    worker.join(10)
    watch.stop()
    assert outcome == {"answer": False, "interrupted": True}


def test_a_next_step_whose_publish_failed_is_sent_by_the_redelivered_member(store):
    from jobsystem.dramatiq_internals import wants_redelivery

    broker, workflows, square, total = workflow_broker(store)
    record, first = annotate("chord", [Step([square.message(2)], pipe="list"), Step([total.message()])])
    workflows.backend.create(record, TTL)
    publish = broker.enqueue

    def refused(message: Any, *, delay: Any = None) -> Any:
        raise ConnectionError("RabbitMQ refused the publish")

    broker.enqueue = refused  # type: ignore[method-assign]
    failed = delivery(first[0])
    workflows.after_process_message(broker, failed, result=4)
    assert wants_redelivery(failed)
    broker.enqueue = publish  # type: ignore[method-assign]
    workflows.after_process_message(broker, delivery(first[0], redelivered=True), result=4)
    assert [(m.actor_name, m.args) for m, _ in broker.enqueued] == [("total", ([4],))]


def test_another_member_redelivered_while_the_step_is_being_sent_does_not_send_it_again(store):
    # A worker SIGKILLed after counting a member but before acking it: RabbitMQ redelivers the
    # member, and its run ends while the worker of the last member is sending the next step
    # (between the publish and the note that it was sent). Only the member that completed the
    # step may send it (again, if its own worker died): a second publish would leave a duplicate
    # of the next step in the queue, deferred while the first runs (the integration test's
    # chord-with-a-SIGKILL found one left over).
    broker, workflows, _, first = square_chord(store, members=3)
    for i in (0, 1):
        workflows.after_process_message(broker, delivery(first[i]), result=i * i)
    publish = broker.enqueue

    def publish_during_which_member_0_ends_again(message: Any, *, delay: Any = None) -> Any:
        broker.enqueue = publish  # type: ignore[method-assign]
        workflows.after_process_message(broker, delivery(first[0], redelivered=True), result=0)
        return publish(message, delay=delay)

    broker.enqueue = publish_during_which_member_0_ends_again  # type: ignore[method-assign]
    workflows.after_process_message(broker, delivery(first[2]), result=4)
    assert [(m.actor_name, m.args) for m, _ in broker.enqueued] == [("total", ([0, 1, 4],))]


def test_the_member_that_completed_the_step_sends_it_again_if_its_worker_died_before_noting_it(store):
    broker, workflows, _, first = square_chord(store)
    workflows.after_process_message(broker, delivery(first[0]), result=0)
    died = workflows.backend.mark_sent

    def killed(*args: Any, **kwargs: Any) -> None:
        raise SystemExit("SIGKILL between the publish and the note")

    workflows.backend.mark_sent = killed  # type: ignore[method-assign]
    with pytest.raises(SystemExit):
        workflows.member_finished(broker, delivery(first[1]), "succeeded", 1)
    workflows.backend.mark_sent = died  # type: ignore[method-assign]
    # The other member's redelivery does not send it; the completing member's does.
    workflows.after_process_message(broker, delivery(first[0], redelivered=True), result=0)
    assert len(broker.enqueued) == 1
    workflows.after_process_message(broker, delivery(first[1], redelivered=True), result=1)
    assert [(m.actor_name, m.args) for m, _ in broker.enqueued] == [("total", ([0, 1],))] * 2
    workflows.after_process_message(broker, delivery(first[1], redelivered=True), result=1)
    assert len(broker.enqueued) == 2  # noted as sent now


def test_a_member_dropped_as_a_duplicate_at_send_counts_as_finished(store):
    from jobsystem.workflows import group as workflow_group
    from middleware.idempotency import Idempotency

    workflows = Workflows(store, ttl_ms=TTL, cancel_ttl_ms=TTL)
    broker = DedupingBroker(middleware=[Idempotency(store), workflows])
    mail = dramatiq.actor(broker=broker, actor_name="mail", queue_name="q", idempotency_key=lambda to: to)(
        lambda to: None
    )
    summary = dramatiq.actor(broker=broker, actor_name="summary", queue_name="q")(lambda counts: None)
    broker.enqueue(mail.message("ana"))  # sent before: the group's first member is a duplicate
    fan_out = workflow_group([mail.message("ana"), mail.message("bob")], broker=broker)
    fan_out.on_finish(summary.message_with_options())  # on_finish adds its argument
    fan_out.run()
    assert [m.actor_name for m, _ in broker.enqueued] == ["mail", "mail"]  # "ana" once, "bob"
    workflows.after_process_message(broker, delivery(broker.enqueued[-1][0]), result=None)
    assert [(m.actor_name, m.args) for m, _ in broker.enqueued[2:]] == [
        ("summary", ({"succeeded": 2, "dead": 0, "cancelled": 0},))
    ]


class DedupingBroker(RecordingBroker):
    """Answers a duplicate send as the project's broker does."""

    def enqueue(self, message: Any, *, delay: Any = None) -> Any:
        from middleware.idempotency import DuplicateMessage, as_duplicate

        try:
            return super().enqueue(message, delay=delay)
        except DuplicateMessage as duplicate:
            return as_duplicate(message, duplicate.original_message_id)


def keyed_workflow_broker(store: StateStore) -> tuple[DedupingBroker, Any, Workflows, Any, Any]:
    """Idempotency and Workflows in the stack's order; ``square`` keyed by its argument."""
    from middleware.idempotency import Idempotency

    idempotency, workflows = Idempotency(store), Workflows(store, ttl_ms=TTL, cancel_ttl_ms=TTL)
    broker = DedupingBroker(middleware=[idempotency, workflows])
    square = dramatiq.actor(
        broker=broker, actor_name="square", queue_name="q", idempotency_key=lambda i: f"square-{i}"
    )(lambda i: i * i)
    total = dramatiq.actor(
        broker=broker, actor_name="total", queue_name="q", idempotency_key=lambda results: "total"
    )(lambda results: None)
    return broker, idempotency, workflows, square, total


def test_a_keyed_member_whose_next_step_was_refused_sends_it_when_it_comes_back_a_duplicate(store):
    """The member's run completed its key while its next step's publish failed (the delivery was
    put back): when it comes back, its key skips it as a duplicate, and that skip sends the step."""
    from jobsystem.dramatiq_internals import wants_redelivery
    from jobsystem.runtime.idempotency_keys import CompletedDuplicate

    broker, idempotency, workflows, square, total = keyed_workflow_broker(store)
    record, first = annotate("chord", [Step([square.message(2)], pipe="list"), Step([total.message()])])
    workflows.backend.create(record, TTL)
    publish = broker.enqueue

    def refused(message: Any, *, delay: Any = None) -> Any:
        raise ConnectionError("RabbitMQ refused the publish")

    ran = delivery(first[0])
    idempotency.before_process_message(broker, ran)
    broker.enqueue = refused  # type: ignore[method-assign]
    workflows.after_process_message(broker, ran, result=4)  # after hooks: in reverse order
    idempotency.after_process_message(broker, ran, result=4)
    assert wants_redelivery(ran) and idempotency.writes.flush(10)
    broker.enqueue = publish  # type: ignore[method-assign]
    again = delivery(first[0], redelivered=True)
    with pytest.raises(CompletedDuplicate) as skipped:
        idempotency.before_process_message(broker, again)
    try:
        raise skipped.value
    except CompletedDuplicate:  # Dramatiq calls the skip hooks inside its except block
        workflows.after_skip_message(broker, again)
        idempotency.after_skip_message(broker, again)
    assert [(m.actor_name, m.args) for m, _ in broker.enqueued] == [("total", ([4],))]
    idempotency.writes.stop()


def test_a_next_step_dropped_as_a_duplicate_at_send_counts_as_finished(store):
    broker, idempotency, workflows, square, total = keyed_workflow_broker(store)
    broker.enqueue(total.message([0]))  # sent before, with the same key: the step will not run here
    record, first = annotate("chord", [Step([square.message(3)], pipe="list"), Step([total.message()])])
    workflows.backend.create(record, TTL)
    workflows.after_process_message(broker, delivery(first[0]), result=9)
    assert [m.actor_name for m, _ in broker.enqueued] == ["total"]  # the one sent before
    found = workflows.backend.get(record["id"])
    assert found is not None and found.state == "succeeded"
    idempotency.writes.stop()


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


def test_a_next_step_is_dated_when_it_is_sent_so_an_age_limit_counts_from_there(store):
    """The next step's message was built when the workflow was launched: sent hours later, with
    its launch time as its timestamp, an age limit (``JOB_MAX_AGE_MS``, ``max_age``) shorter than
    the steps before it dead-lettered it as too old the moment it arrived."""
    from dramatiq.middleware import AgeLimit

    from jobsystem.workflows import pipeline as workflow_pipeline

    broker, workflows, square, total = workflow_broker(store)
    flow = workflow_pipeline([square.message(2), total.message_with_options(max_age=300)], broker=broker)
    flow.run()
    time.sleep(0.4)  # the first step runs longer than the next step's age limit
    before = int(time.time() * 1000)
    workflows.after_process_message(broker, delivery(broker.enqueued[0][0]), result=4)
    (sent, _) = broker.enqueued[1]
    assert sent.message_timestamp >= before
    AgeLimit().before_process_message(broker, delivery(sent))  # type: ignore[no-untyped-call]  # young enough: runs


def test_a_group_of_no_members_runs_its_callback_at_once(store):
    """A campaign to an empty segment: with no member to end, nothing ever counted the step and
    its ``on_finish`` callback (the owner's summary) never ran; the workflow ran forever."""
    from jobsystem.workflows import group as workflow_group
    from jobsystem.workflows import workflow_status

    broker, workflows, _, total = workflow_broker(store)
    fan_out = workflow_group([], broker=broker)
    fan_out.on_finish(total.message())
    fan_out.run()
    assert [(m.actor_name, m.args) for m, _ in broker.enqueued] == [
        ("total", ({"succeeded": 0, "dead": 0, "cancelled": 0},))
    ]
    workflows.after_process_message(broker, delivery(broker.enqueued[0][0]), result=None)
    assert workflow_status(str(fan_out.workflow_id), broker=broker)["state"] == "succeeded"  # type: ignore[index]
    workflow_group([], broker=broker).run()  # nothing to run: done at once
    assert len(broker.enqueued) == 1


def test_an_empty_group_in_a_pipeline_hands_the_next_step_an_empty_list(store):
    from jobsystem.workflows import group as workflow_group
    from jobsystem.workflows import pipeline as workflow_pipeline

    broker, workflows, square, total = workflow_broker(store)
    flow = workflow_pipeline(
        [square.message(3), workflow_group([], broker=broker), total.message()], broker=broker
    )
    flow.run()
    workflows.after_process_message(broker, delivery(broker.enqueued[0][0]), result=9)
    assert [(m.actor_name, m.args) for m, _ in broker.enqueued[1:]] == [("total", ([],))]
    workflows.after_process_message(broker, delivery(broker.enqueued[1][0]), result=0)
    found = workflows.backend.get(str(flow.workflow_id))
    assert found is not None and found.state == "succeeded"


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


def test_a_first_step_keeps_its_own_delay_as_dramatiqs_pipeline_does(store):
    """Dramatiq's ``pipeline.run`` delays the first message by the larger of its own ``delay`` and
    the run's; a next step here keeps its own too. The first step's own delay was dropped: the
    job ran at once."""
    from jobsystem.workflows import pipeline as workflow_pipeline

    broker, workflows, square, total = workflow_broker(store)
    workflows.ttl_ms = 200
    first = square.message_with_options(args=(2,), delay=600)
    flow = workflow_pipeline([first, total.message()], broker=broker).run()
    workflow_pipeline([first, total.message()], broker=broker).run(delay=900)
    workflow_pipeline([square.message(3), total.message()], broker=broker).run(delay=300)
    assert [delay for _, delay in broker.enqueued] == [600, 900, 300]
    time.sleep(0.4)  # past the TTL, within the delay: the record waits for it
    assert workflows.backend.get(str(flow.workflow_id)) is not None


def test_a_message_given_twice_is_refused_not_left_waiting_for_ever(store):
    """``group([m] * 3)``: the three sends share one message id, which the store counts once, so
    the step never completed and its callback never ran (Dramatiq's group runs it). Refused."""
    from jobsystem.workflows import group as workflow_group
    from jobsystem.workflows import pipeline as workflow_pipeline

    broker, _, square, total = workflow_broker(store)
    once = square.message(2)
    fan_out = workflow_group([once] * 3, broker=broker)
    fan_out.add_completion_callback(total.message())
    with pytest.raises(ValueError, match="more than once"):
        fan_out.run()
    with pytest.raises(ValueError, match="more than once"):
        workflow_pipeline(
            [once, workflow_group([once, square.message(3)], broker=broker)], broker=broker
        ).run()
    assert broker.enqueued == []


def test_a_step_sent_again_hands_on_the_result_it_was_counted_with(store):
    """The member's end was counted (result 4) and its worker died before sending the next step.
    Its redelivery ran again and ended another way (here: dead-lettered): the step was then sent
    with that run's result (None), not with the result the step was completed with."""
    broker, workflows, square, total = workflow_broker(store)
    record, first = annotate("pipeline", [Step([square.message(2)]), Step([total.message()])])
    workflows.backend.create(record, TTL)
    workflows.backend.finish(record["id"], 0, first[0].message_id, "succeeded", "4", TTL)  # then died
    again = delivery(first[0], redelivered=True)
    again.fail()
    workflows.after_nack(broker, again)
    assert [(m.actor_name, m.args) for m, _ in broker.enqueued] == [("total", (4,))]


def test_a_step_sent_again_hands_on_a_none_it_was_counted_with(store):
    """The completer returned None (kept as null), its worker died before sending the next step,
    and its redelivery returned 5: ``None`` was read as "no result kept" and 5 handed on. Only a
    result too large to keep (recorded empty) gives way to the later run's."""
    broker, workflows, square, total = workflow_broker(store)
    workflows.result_max_bytes = 8
    for recorded, again, piped in ((None, 5, None), ("too large to keep", 5, 5)):
        record, first = annotate("pipeline", [Step([square.message(2)]), Step([total.message()])])
        workflows.backend.create(record, TTL)
        encoded = workflows._encode(recorded)
        workflows.backend.finish(record["id"], 0, first[0].message_id, "succeeded", encoded, TTL)  # died
        workflows.after_process_message(broker, delivery(first[0], redelivered=True), result=again)
        assert [(m.actor_name, m.args) for m, _ in broker.enqueued[-1:]] == [("total", (piped,))]


def test_the_members_a_cancelled_workflow_stops_are_read_with_the_marks_while_it_is_recorded(store):
    """A member is stopped by its mark, or by its workflow recorded cancelled unless the workflow
    counted it as ended otherwise before; an expired workflow stops nothing (on SQLite its rows
    stay until a sweep)."""
    backend = workflow_backend(store)
    record, _ = chord(store)
    cancel_marks(store).mark_cancelled(["marked"], TTL)
    members = [(m, record["id"]) for m in ("m0", "m1", "m2", "next")]
    backend.finish(record["id"], 0, "m0", "succeeded", "0", TTL)  # ended before the cancel
    asked = [("marked", None), ("plain", None), *members]
    assert backend.cancelled_among(asked) == [True, False, False, False, False, False]  # it runs
    assert backend.set_state(record["id"], "cancelled")
    backend.finish(record["id"], 0, "m1", "cancelled", "null", TTL)  # skipped since
    assert backend.cancelled_among([*asked, ("plain", "unknown")]) == [
        *(True, False),  # marked, plain
        *(False, True, True, True),  # m0 ended before the cancel, m1, m2, next
        False,  # plain, of a workflow that is not recorded
    ]
    short = {**record, "id": "short"}
    backend.create(short, 50)
    assert backend.set_state("short", "cancelled")
    assert backend.cancelled_among([("m0", "short")]) == [True]
    # One message in two workflows, asked in one call: each pair answered for its own workflow.
    assert backend.cancelled_among([("m0", record["id"]), ("m0", "short")]) == [False, True]
    wait_until(lambda: backend.get("short") is None)
    assert backend.cancelled_among([("m0", "short")]) == [False]
    assert backend.cancelled_among([]) == []


#: The marks' TTL (``CANCEL_TTL_MS``) of the tests whose steps arrive after their marks expired.
SHORT = 200


def short_marks_broker(store: StateStore) -> tuple[RecordingBroker, Cancellation, Workflows, Any, Any]:
    """Cancellation and Workflows whose cancels mark for ``SHORT`` ms; the ``square`` and
    ``total`` actors. The cancellation poller polls when a test says (no thread of its own)."""
    cancellation = Cancellation(store, keep_ms=SHORT, poll_interval=60)
    cancellation.watch.start = lambda: None  # type: ignore[method-assign]
    workflows = Workflows(store, ttl_ms=TTL, cancel_ttl_ms=SHORT)
    broker = RecordingBroker(middleware=[cancellation, workflows])
    square = dramatiq.actor(broker=broker, actor_name="square", queue_name="q")(lambda i: i * i)
    total = dramatiq.actor(broker=broker, actor_name="total", queue_name="q")(lambda result: None)
    return broker, cancellation, workflows, square, total


def arrives_cancelled(
    store: StateStore, broker: RecordingBroker, cancellation: Cancellation, message: Any
) -> Any:
    """``message`` arriving once its mark expired, at a worker whose poller is up to date (and
    knows no mark): skipped as cancelled, or the test fails. Returns the delivery."""
    marks, workflow_id = cancel_marks(store), message.options[WORKFLOW]["id"]
    wait_until(lambda: not marks.cancelled_among([message.message_id, (message.message_id, workflow_id)]))
    cancellation.watch.poll_once()
    assert cancellation.watch.known(message.message_id) is False
    arrived = delivery(message)
    with pytest.raises(SkipMessage, match="cancelled"):
        cancellation.before_process_message(broker, arrived)
    assert arrived.options[CANCELLED] is True
    return arrived


def test_a_step_sent_as_its_workflow_is_cancelled_is_skipped_after_its_mark_expired(store):
    """The cancel lands between the count that completes the first step and the send of the next
    one, delayed longer than the marks live: the step arrived with no mark left and ran, in a
    workflow recorded cancelled. Its workflow's record says so as long as it exists."""
    from jobsystem.workflows import cancel, pipeline, workflow_status

    broker, cancellation, workflows, square, total = short_marks_broker(store)
    flow = pipeline([square.message(2), total.message_with_options(delay=10 * SHORT)], broker=broker)
    count = workflows.backend.finish

    def count_then_cancel(workflow_id: str, step: int, *rest: Any, **named: Any) -> Any:
        progress = count(workflow_id, step, *rest, **named)
        if step == 0:
            assert progress.send_next and cancel(workflow_id, broker=broker)
        return progress

    workflows.backend.finish = count_then_cancel  # type: ignore[method-assign]
    flow.run()
    workflows.after_process_message(broker, delivery(broker.enqueued[0][0]), result=4)
    (step, delay) = broker.enqueued[1]
    assert step.actor_name == "total" and delay == 10 * SHORT  # sent after the cancel
    arrived = arrives_cancelled(store, broker, cancellation, step)
    workflows.after_skip_message(broker, arrived)  # counted as cancelled, not failed
    shown = workflow_status(str(flow.workflow_id), broker=broker)
    assert shown is not None and shown["state"] == "cancelled"
    assert [m["state"] for m in shown["steps"][1]["members"]] == ["cancelled"]


def test_a_first_step_member_delayed_past_its_mark_is_skipped_but_not_one_counted_before(store):
    """With ``JOB_STATUS=false`` a mark lives ``CANCEL_TTL_MS`` whatever the member's delay: a
    member due later arrived with none left and ran. A member that ended before the cancel was
    not marked by it: its redelivery is not stopped by the workflow's state either."""
    from jobsystem.workflows import cancel, group

    broker, cancellation, workflows, square, _ = short_marks_broker(store)
    fan_out = group(
        [square.message(1), square.message_with_options(args=(2,), delay=10 * SHORT)], broker=broker
    )
    fan_out.run()
    (done, _), (late, _) = broker.enqueued
    workflows.after_process_message(broker, delivery(done), result=1)
    assert cancel(str(fan_out.workflow_id), broker=broker) == [late.message_id]
    arrives_cancelled(store, broker, cancellation, late)
    again = delivery(done, redelivered=True)
    cancellation.before_process_message(broker, again)  # as old as the pollers' memory: asked, runs
    assert CANCELLED not in again.options


def noting(calls: list[str], name: str, call: Callable[..., Any]) -> Callable[..., Any]:
    """``call``, noting ``name`` in ``calls`` each time it is called (which store call a check made)."""

    def noted(*args: Any) -> Any:
        calls.append(name)
        return call(*args)

    return noted


def test_a_members_workflow_is_read_in_the_marks_call_and_a_store_error_defers_it(store):
    """A workflow's member asks the store once, the marks and its workflow in one call; a job that
    is not a member asks for its mark only, as before. A store error defers the member (fail closed)."""
    broker, cancellation, _, square, _ = short_marks_broker(store)
    calls: list[str] = []
    members = cancellation.workflows.cancelled_among
    backend = cancellation.backend
    backend.cancelled_among = noting(calls, "marks", backend.cancelled_among)  # type: ignore[method-assign]

    def down(arrivals: Any) -> list[bool]:
        calls.append("workflows")
        raise StoreUnavailable("redis: ResponseError: OOM command not allowed")

    cancellation.workflows.cancelled_among = down  # type: ignore[method-assign]
    plain = dramatiq.actor(broker=broker, actor_name="plain", queue_name="q")(lambda: None)
    cancellation.before_process_message(broker, delivery(plain.message()))
    assert calls == ["marks"]
    _, first = annotate("group", [Step([square.message(1)], pipe="list")])
    with pytest.raises(SkipMessage, match="deferred: store_unavailable"):
        cancellation.before_process_message(broker, delivery(first[0]))
    assert calls == ["marks", "workflows"]
    (copy, delay), *_ = broker.enqueued
    assert delay and copy.options["cancellation_store_waits"] == 1
    cancellation.workflows.cancelled_among = members  # type: ignore[method-assign]
