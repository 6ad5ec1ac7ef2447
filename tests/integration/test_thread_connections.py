"""Broker work done on threads that end leaves no RabbitMQ connection open (real RabbitMQ, Redis).

Dramatiq's RabbitMQ broker opens one connection per thread and keeps it until ``broker.close()``:
a thread that publishes or declares a queue once and then ends left its connection open for the
life of the process. Three such threads: the dashboard's request threads (anyio retires one after
10 s idle and starts new ones later), the workflow middleware's retry timers, and a worker thread
that died (the watchdog replaces it). Counted where it matters, in RabbitMQ (the management API),
and in the broker's own set of connections.
"""

from __future__ import annotations

from typing import Any

from dashboard.project import Project
from jobsystem.dramatiq_internals import ProjectMessage
from jobsystem.runtime.workflow_steps import Step, annotate
from jobsystem.store.base import StoreUnavailable
from middleware.workflows import find_workflows
from tests import workload
from tests.asgi import app_of, call
from tests.connections import held_open, name_connections, named_url
from tests.senders import publish_dead_letters, sender_system
from tests.support import TEST_REDIS_URL, wait_for

#: How many threads each test does its broker work from, one after the other.
THREADS = 3


def test_dashboard_actions_leave_no_connection_open_once_their_threads_end(queues, prefix):
    """Each retry runs on a new request thread (each call runs the app on an event loop of its own,
    whose pool threads end with it), and declares the queue it replays into on that thread's
    connection: one more connection held open per thread, for as long as the dashboard ran."""
    targets = [f"{prefix}replayed-{i}" for i in range(THREADS)]
    for queue in targets:
        publish_dead_letters(queues.broker, queue, count=2)
    system = sender_system(prefix, TEST_REDIS_URL)
    name = f"{prefix}dashboard"
    name_connections(system.broker, name)
    app, post = app_of(Project(system))
    try:
        for queue in targets:
            answer = call(app, "POST", "/api/dead-letters/retry", {"queue": queue, "all": True}, post)
            assert answer.status_code == 200 and answer.json()["retried"] == 2, answer.text
        assert [queues.depth(queue) for queue in targets] == [2] * THREADS  # the work was done
        assert held_open(queues.settings, name) == 0
        assert system.broker.connections == set()
    finally:
        system.broker.close()


def test_workflow_steps_sent_by_retry_timers_leave_no_connection_open(queues, prefix):
    """A dead-lettered member the store could not count is counted again from a timer thread,
    which sends the next step when that completes it (a group's ``on_finish`` callback here)."""
    system = sender_system(prefix, TEST_REDIS_URL)
    name = f"{prefix}timers"
    name_connections(system.broker, name)
    workflows = find_workflows(system.broker)
    workflows.dead_retry_s = 0.05
    counted = workflows.backend.finish
    refused: set[str] = set()

    def once_refused(workflow_id: str, *args: Any, **kwargs: Any) -> Any:
        if workflow_id not in refused:  # the store does not answer the first time
            refused.add(workflow_id)
            raise StoreUnavailable("redis: TimeoutError")
        return counted(workflow_id, *args, **kwargs)

    workflows.backend.finish = once_refused  # type: ignore[method-assign]
    try:
        for i in range(THREADS):
            member = queues.message(workload.record, f"member-{i}")
            callback = queues.message(workload.record, f"done-{i}").copy(options={"pipe_ignore": True})
            record, first = annotate("group", [Step([member], "finished", "counts"), Step([callback])])
            workflows.backend.create(record, workflows.ttl_ms)
            workflows.after_nack(system.broker, ProjectMessage(False, i, first[0]))
        sent = queues.name(workload.record)
        wait_for(lambda: (queues.declared(sent) or (0, 0))[0] == THREADS, what="the steps sent")
        # Each timer sent its step: it opened a connection. Its thread ends once the step is noted.
        wait_for(lambda: system.broker.connections == set(), timeout=10, what="no connection left")
        assert held_open(queues.settings, name) == 0
    finally:
        system.broker.close()


def test_a_worker_thread_the_watchdog_replaces_leaves_no_connection_open(start_worker, queues, store, prefix):
    """A worker thread opens its connection at its first send (the job sends a message); one that
    died kept it open as long as its worker process ran, one more for each thread replaced."""
    name = f"{prefix}worker"
    worker = start_worker(threads=1, RABBITMQ_URL=named_url(queues.settings, name))

    def sent(token: str) -> None:
        wait_for(lambda: store.get(f"test:{prefix}sent:sync:{token}"), what=f"the job's send {token}")

    queues.send(workload.send_elsewhere, "first", "elsewhere_actor")
    sent("first")
    with_thread = held_open(queues.settings, name)  # the consumers', and the worker thread's
    queues.send_with_options(workload.send_elsewhere, args=("dies", "elsewhere_actor"), kill_thread="worker")
    wait_for(lambda: worker.events("worker_thread_replaced"), what="the thread replaced")
    sent("dies")
    wait_for(lambda: held_open(queues.settings, name) == with_thread - 1, what="its connection closed")
    closed = wait_for(lambda: worker.events("dead_thread_connections_closed"), what="the close logged")
    assert [line["connections"] for line in closed] == [1]
    queues.send(workload.send_elsewhere, "after", "elsewhere_actor")  # the replacement sends
    sent("after")
    assert held_open(queues.settings, name) == with_thread
