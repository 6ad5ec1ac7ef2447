"""A message naming no registered actor: its ``actor_name`` is the sender's text (an e-mail
address, a person's name), and no log line, job status record, Sentry event or dead letter of a
real worker carries it; a registered actor's name is shown as before."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from typing import Any

from dramatiq import Message

from jobsystem.store import open_store
from jobsystem.store.status import status_backend
from tests import workload
from tests.queues import Queues
from tests.servers import sentry_events, sentry_server
from tests.support import TEST_REDIS_URL, wait_for
from tests.workers import Worker

#: An e-mail address, and a person's name shaped as an identifier (no pattern tells it apart).
SENDERS_TEXT = ("ana@example.com", "Ana_Lopez_1980")


def _undefined_actor_events(envelopes: list[bytes]) -> list[dict[str, Any]]:
    return [e for e in sentry_events(list(envelopes)) if "undefined actor" in json.dumps(e.get("logentry"))]


def _declared(queues: Queues, queue: str) -> str:
    """``queue``, declared with its ``.DQ`` and ``.DLQ`` before anything is published raw to it.
    ``start_worker`` returns once the worker says it is ready, which Dramatiq logs when its
    consumer threads have started, before they have declared their queues; a raw publish
    declares nothing (a send does), so under load one went to no queue and was dropped."""
    queues.broker.declare_queue(queue, ensure=True)
    return queue


def _waited(
    predicate: Callable[[], Any], what: str, status: Any, worker: Worker, messages: list[Message[Any]]
) -> Any:
    """``wait_for(predicate)`` for 60 s; on a timeout, what each message got is said: its status
    record's state and the worker's lines about it."""
    try:
        return wait_for(predicate, timeout=60, what=what)
    except AssertionError as timeout:
        seen = {
            m.message_id: (
                getattr(status.get(m.message_id), "state", None),
                [line["event"] for line in worker.events(message_id=m.message_id)],
            )
            for m in messages
        }
        raise AssertionError(f"{timeout}; each message's record state and worker lines: {seen}") from None


def test_a_message_of_no_registered_actor_leaves_no_trace_of_its_actor_name(start_worker, queues, prefix):
    queue = _declared(queues, queues.name(workload.record))
    status = status_backend(open_store(TEST_REDIS_URL, namespace=f"jobs:{prefix}"))
    with sentry_server() as (dsn, envelopes):
        worker = start_worker(SENTRY_DSN=dsn)
        bogus: list[Message[Any]] = [
            Message(queue_name=queue, actor_name=name, args=(), kwargs={}, options={})
            for name in SENDERS_TEXT
        ]
        for message in bogus:
            queues.publish_raw(message)
        known = queues.send(workload.record, "t1")
        _waited(lambda: queues.depth(queue + ".DLQ") == 2, "both dead letters", status, worker, bogus)
        records = wait_for(
            lambda: (
                all(status.get(m.message_id) for m in [*bogus, known])
                and {m.message_id: status.get(m.message_id) for m in [*bogus, known]}
            ),
            what="the status records",
        )
        wait_for(lambda: len(_undefined_actor_events(envelopes)) == 2, what="both errors in Sentry")
        wait_for(lambda: worker.output().count("job_dead_lettered") == 2, what="both dead-letter lines")
        assert worker.stop() == 0
        received = b"".join(envelopes).decode("utf-8", "replace")
        errors = [v["value"] for e in _undefined_actor_events(envelopes) for v in e["exception"]["values"]]
    assert errors == ["unknown", "unknown"]  # ActorNotFound's message is the name it looked up
    letters = json.dumps([m["properties"] for m in queues.peek(queue + ".DLQ", count=10)])
    for message in bogus:
        assert records[message.message_id].actor == "unknown"
    assert records[known.message_id].actor == "record"
    started = worker.events("job_started", "job_succeeded", message_id=known.message_id)
    assert [line["actor"] for line in started] == ["record", "record"]
    dead = [worker.events("job_dead_lettered", message_id=m.message_id) for m in bogus]
    assert [[line["actor"] for line in lines] for lines in dead] == [["unknown"], ["unknown"]]
    output = worker.output()
    for name in SENDERS_TEXT:
        for where, text in (("log", output), ("sentry", received), ("dead letters", letters)):
            assert name.casefold() not in text.casefold(), where


def test_a_delayed_message_the_worker_releases_records_only_a_registered_actor(start_worker, queues, prefix):
    """The worker moves a due ``.DQ`` message to its queue through ``enqueue``: the status record,
    whose actor is written once, there and then, names no actor the worker does not have."""
    queue = _declared(queues, queues.name(workload.record))
    status = status_backend(open_store(TEST_REDIS_URL, namespace=f"jobs:{prefix}"))
    worker = start_worker()
    now = int(time.time() * 1000)
    delayed: list[Message[Any]] = [
        Message(queue_name=queue + ".DQ", actor_name=name, args=args, kwargs={}, options={"eta": now})
        for name, args in (("Ana_Lopez_1980", ()), ("record", ("t2",)))
    ]
    for message in delayed:
        queues.publish_raw(message)

    def final() -> list[Any] | None:
        found = [status.get(m.message_id) for m in delayed]
        return found if all(r is not None and r.state in ("dead", "succeeded") for r in found) else None

    records = _waited(final, "both records final", status, worker, delayed)
    assert worker.stop() == 0
    assert [(r.state, r.actor) for r in records] == [("dead", "unknown"), ("succeeded", "record")]
    assert "Ana" not in json.dumps([dataclasses.asdict(r) for r in records])


def test_a_send_to_another_services_actor_keeps_its_name_from_sync_and_async_actors(
    start_worker, queues, prefix, store
):
    """An actor may send to another service's actor (a name this worker has no actor of): the
    sent message's status record, written by the worker, names it as a sender's would, whether
    the actor is a function on a worker thread or a coroutine on Dramatiq's event loop thread
    (AsyncIO middleware; the loop runs the coroutine in the worker thread's context, which marks
    it as running an actor); a name no actor can have is ``unknown`` from both."""
    status = status_backend(open_store(TEST_REDIS_URL, namespace=f"jobs:{prefix}"))
    worker = start_worker(TEST_ASYNCIO="1")
    names = {"billing": "billing.charge", "person": "Ana Lopez"}
    jobs = [
        queues.send(actor, token, name)
        for token, name in names.items()
        for actor in (workload.send_elsewhere, workload.send_elsewhere_async)
    ]
    queues.wait_finished(jobs)
    keys = {f"{how}:{token}": f"test:{prefix}sent:{how}:{token}" for token in names for how in SENDS}
    sent = wait_for(
        lambda: all(map(store.get, keys.values())) and {name: store.get(k) for name, k in keys.items()},
        what="the sends",
    )
    records = wait_for(
        lambda: all(map(status.get, sent.values())) and {name: status.get(m) for name, m in sent.items()},
        what="the sent messages' records",
    )
    assert worker.stop() == 0
    assert {name: record.actor for name, record in records.items()} == {
        **{f"{how}:billing": "billing.charge" for how in SENDS},
        **{f"{how}:person": "unknown" for how in SENDS},
    }


#: Where the test actors send from: a worker thread, the event loop thread, a thread of ``asyncio.to_thread``.
SENDS = ("sync", "async", "to_thread")
