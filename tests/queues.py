"""The per-test queues on the real RabbitMQ: sending to them, counting and peeking through passive
declares and the management API, waiting for their consumers and outcomes, and deleting what a
test's or a run's prefix made."""

from __future__ import annotations

import contextlib
import importlib
import re
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from urllib.parse import quote

import dramatiq
import requests
from dramatiq.common import dq_name, q_name

from jobsystem.rabbitmq.broker import ProjectBroker
from jobsystem.settings import Settings
from jobsystem.system import get_system
from tests.support import wait_for
from tests.workers import WORKER_MODULES, Worker

__all__ = ["FINISHED_STATES", "Queues", "delete_prefixed", "drop_closed", "prefixed_topology"]

#: Job states after which nothing more happens to a message (``jobsystem/store/status.py``).
FINISHED_STATES = frozenset({"succeeded", "dead", "skipped", "cancelled"})


def drop_closed(broker: Any) -> None:
    """Forget this thread's connection or channel of ``broker`` if something closed it (a test
    that closes a connection on purpose, a refused declare or publish, RabbitMQ after a test that
    ran past two heartbeats without using it), so the next use opens new ones rather than failing
    on them in every later test of this process."""
    import pika.exceptions

    connection = getattr(broker.state, "connection", None)
    if connection is not None and connection.is_open:
        with contextlib.suppress(pika.exceptions.AMQPError):
            connection.process_data_events(0)  # a connection RabbitMQ dropped is found closed here
    if connection is not None and not connection.is_open:
        del broker.connection  # and its channel
        return
    channel = getattr(broker.state, "channel", None)
    if channel is not None and not channel.is_open:
        del broker.channel


#: What a test's prefix (``t`` and 10 hex digits) or a whole run's mark (``t`` and 4) looks like.
_TEST_PREFIX = re.compile(r"t[0-9a-f]{4,10}-?")


def prefixed_topology(settings: Settings, prefix: str) -> list[tuple[str, str]]:
    """``(url, name)`` of each queue and exchange (the delay cascade's carry the prefix too) whose
    name starts with ``prefix``, from the management API."""
    found = []
    for kind in ("queues", "exchanges"):
        url = settings.management_api(kind, settings.rabbitmq_vhost)
        response = requests.get(url, params={"columns": "name"}, auth=settings.management_auth, timeout=10)
        response.raise_for_status()
        names = [item["name"] for item in response.json() if item["name"].startswith(prefix)]
        found += [(f"{url}/{quote(name, safe='')}", name) for name in names]
    return found


def delete_prefixed(settings: Settings, prefix: str) -> list[str]:
    """Delete the queues and exchanges whose names start with ``prefix``, a test's or a run's;
    returns their names. Any other prefix is refused: the vhost may be shared."""
    if not _TEST_PREFIX.fullmatch(prefix):
        raise ValueError(f"not a test prefix: {prefix!r}")
    found = prefixed_topology(settings, prefix)
    for url, _ in found:
        requests.delete(url, auth=settings.management_auth, timeout=10)
    return [name for _, name in found]


class Queues:
    """The per-test queues: send to them, count them, and delete them at the end of the test."""

    def __init__(self, prefix: str, broker: ProjectBroker | None = None) -> None:
        self.prefix = prefix
        self.settings = get_system().settings
        self.broker = broker or get_system().broker

    def using(self, broker: ProjectBroker) -> Queues:
        """The same queues, sending through ``broker``."""
        return Queues(self.prefix, broker)

    def name(self, actor: dramatiq.Actor[Any, Any]) -> str:
        return self.prefix + actor.queue_name.removeprefix(self.settings.queue_prefix)

    def message(self, actor: dramatiq.Actor[Any, Any], *args: Any, **kwargs: Any) -> dramatiq.Message[Any]:
        return actor.message(*args, **kwargs).copy(queue_name=self.name(actor))

    def send(self, actor: dramatiq.Actor[Any, Any], *args: Any, **kwargs: Any) -> dramatiq.Message[Any]:
        return self.send_with_options(actor, args=args, kwargs=kwargs)

    def send_with_options(self, actor: dramatiq.Actor[Any, Any], **options: Any) -> dramatiq.Message[Any]:
        message = actor.message_with_options(**options).copy(queue_name=self.name(actor))
        result: dramatiq.Message[Any] = self.broker.enqueue(message)
        return result

    def publish_raw(self, message: dramatiq.Message[Any], copies: int = 1) -> None:
        """Publish ``message``'s body as it is, bypassing every middleware (a redelivery, a
        client that sends twice). Unlike a send, it declares nothing: its queue must exist (a
        worker's consumers declare theirs: the ``start_worker`` fixture waits for them). A body no queue
        takes is returned by RabbitMQ and raised here (``pika.exceptions.UnroutableError``),
        rather than dropped, which a test would only see as a timeout."""
        import pika

        channel = get_system().broker.channel  # with publisher confirms: a return is raised
        for _ in range(copies):
            channel.basic_publish(
                "",
                message.queue_name,
                message.encode(),
                pika.BasicProperties(delivery_mode=2),
                mandatory=True,
            )

    @property
    def auth(self) -> tuple[str, str]:
        """The management API's credentials, for the URLs of :meth:`api` (which carry none)."""
        return self.settings.management_auth

    def api(self, path: str) -> str:
        return (
            f"{self.settings.management_url}/api/queues/{quote(self.settings.rabbitmq_vhost, safe='')}{path}"
        )

    def info(self, queue: str) -> dict[str, Any]:
        response = requests.get(self.api(f"/{quote(queue, safe='')}"), auth=self.auth, timeout=10)
        response.raise_for_status()
        info: dict[str, Any] = response.json()
        return info

    def declared(self, queue: str) -> tuple[int, int] | None:
        """``queue``'s ready messages and consumers (a passive declare), or None while nobody has
        declared it yet. Asked on a channel of its own: RabbitMQ closes the channel a 404 came on,
        and the broker's shared one would then stay closed for every later test in this process."""
        import pika.exceptions

        broker = get_system().broker
        drop_closed(broker)
        channel = broker.connection.channel()
        try:
            method = channel.queue_declare(queue, passive=True).method
        except pika.exceptions.ChannelClosedByBroker as error:
            if error.reply_code == 404:
                return None
            raise
        channel.close()
        return int(method.message_count), int(method.consumer_count)

    def depth(self, queue: str) -> int:
        """Messages *ready* in ``queue`` right now (a passive declare's count). Messages a worker
        has prefetched, is running, or holds until their eta (``.DQ``) are not counted: zero does
        not mean "done" while a consumer is attached. The count is exact with no consumer (a
        dead-letter queue, a queue before any worker starts or after :meth:`left_after_stop`)."""
        counts = self.declared(queue)
        if counts is None:
            raise AssertionError(f"{queue} is not declared")
        return counts[0]

    def wait_consumers(self, queue: str, count: int, timeout: float = 30.0) -> None:
        """Wait until ``count`` consumers are attached to ``queue``: a worker logs that it is ready
        once its consumer threads started, before they have subscribed (and declared it)."""

        def attached() -> bool:
            counts = self.declared(queue)
            return counts is not None and counts[1] >= count

        wait_for(attached, timeout, what=f"{count} consumers on the queue")

    def consumed(self) -> list[str]:
        """The queues a worker on these queues consumes, as far as this process knows its actors:
        the queue of each actor of :data:`~tests.workers.WORKER_MODULES` and its ``.DQ`` (OwnQueues
        limits a worker to these). The modules are imported here as the worker imports them (most
        test modules have already); an actor of another module (a bench's, the demo's) that this
        process declared is not taken for one of the worker's."""
        for module in WORKER_MODULES:
            importlib.import_module(module)
        modules = tuple(f"{module}." for module in WORKER_MODULES)
        canonical = {
            q_name(actor.queue_name)
            for actor in get_system().broker.actors.values()
            if f"{actor.fn.__module__}.".startswith(modules)
        }
        names = sorted(self.prefix + queue.removeprefix(self.settings.queue_prefix) for queue in canonical)
        return [name for queue in names for name in (queue, dq_name(queue))]

    def wait_consumed(
        self, consumers: Callable[[], int], timeout: float = 30.0, *, at_most: bool = False
    ) -> None:
        """Wait until each of :meth:`consumed` has ``consumers()`` consumers (asked at each look:
        one per worker process still running). A worker logs that it is ready once its consumer
        threads started, before they declared and subscribed to their queues: a raw publish right
        after could find no queue, and a message no consumer. Fails naming the queue it waited for.

        With ``at_most``, wait until none has more (a queue not declared has none): RabbitMQ drops
        a killed worker's consumers only once it has seen its connections close, and until then
        they count as well as a new worker's would."""
        pending = self.consumed()
        deadline = time.monotonic() + timeout
        while pending:
            counts = self.declared(pending[0])
            if at_most and (counts is None or counts[1] <= consumers()):
                pending.pop(0)
                continue
            if not at_most and counts is not None and counts[1] >= consumers():
                pending.pop(0)
                continue
            if time.monotonic() > deadline:
                bound = "at most " if at_most else ""
                raise AssertionError(
                    f"timed out after {timeout:g} s waiting for {bound}{consumers()} consumers on "
                    f"{pending[0]}, a queue the worker consumes "
                    f"(it has {counts[1] if counts else 'not been declared'})"
                )
            time.sleep(0.01)

    # -- terminal signals ---------------------------------------------------------------------------

    def _status(self) -> Any:
        from middleware.status import find_status

        status = find_status(self.broker)
        if status is None:
            raise AssertionError("the sending broker has no Status middleware (JOB_STATUS is off)")
        return status

    def status(self, message_id: str) -> Any:
        """The job status record of ``message_id`` (a ``JobStatus``), read from the state store the
        sending broker uses (the test's namespace), or None."""
        return self._status().get(message_id)

    def wait_finished(
        self, messages: Iterable[dramatiq.Message[Any] | str], timeout: float = 60.0
    ) -> dict[str, Any]:
        """Wait until each message has a final status (succeeded, dead, skipped); returns the
        records by message id. The worker writes them a few ms after the job ended."""
        ids = [m if isinstance(m, str) else m.message_id for m in messages]

        def finished() -> dict[str, Any] | None:
            records = {message_id: self.status(message_id) for message_id in ids}
            if all(r is not None and r.state in FINISHED_STATES for r in records.values()):
                return records
            return None

        result: dict[str, Any] = wait_for(finished, timeout, interval=0.1, what=f"final states of {ids}")
        return result

    def totals(self, queue: str) -> dict[str, int]:
        """How many distinct messages of ``queue`` reached each state so far (the status counters:
        a message counts once per state, however often it is delivered)."""
        counts: dict[str, int] = self._status().backend.counts([queue])[queue]
        return counts

    def wait_totals(self, queue: str, timeout: float = 60.0, **states: int) -> dict[str, int]:
        """Wait until ``queue``'s status counters reach at least ``states`` (``succeeded=200``):
        that many distinct messages got there. Returns the counters."""

        def reached() -> dict[str, int] | None:
            counts = self.totals(queue)
            return counts if all(counts.get(s, 0) >= n for s, n in states.items()) else None

        result: dict[str, int] = wait_for(reached, timeout, interval=0.1, what=f"{queue} totals {states}")
        return result

    def left_after_stop(self, workers: Iterable[Worker], *queues: str) -> int:
        """Stop ``workers`` with SIGTERM and count the messages left in ``queues`` and their
        ``.DQ``. A stopped worker has finished its running jobs and handed back every message it
        prefetched or held until its eta (its channel closed only after RabbitMQ requeued them):
        with no consumer left, the passive declares count everything still waiting."""
        for worker in workers:
            code = worker.stop()
            assert code == 0, f"worker exited with {code}:\n{worker.output()}"
        return sum(self.depth(q) + self.depth(q + ".DQ") for q in queues)

    def peek(self, queue: str, count: int = 100) -> list[dict[str, Any]]:
        """Messages in ``queue`` without consuming them (the management API's requeueing get)."""
        response = requests.post(
            self.api(f"/{quote(queue, safe='')}/get"),
            json={"count": count, "ackmode": "ack_requeue_true", "encoding": "auto"},
            auth=self.auth,
            timeout=10,
        )
        response.raise_for_status()
        result: list[dict[str, Any]] = response.json()
        return result

    @contextlib.contextmanager
    def capped(self, queue: str, max_length: int) -> Iterator[None]:
        """A RabbitMQ policy capping ``queue`` at ``max_length`` messages and nacking further
        publishes (a full queue, a broker refusing), applied before the block, removed after."""
        vhost = quote(self.settings.rabbitmq_vhost, safe="")
        url = f"{self.settings.management_url}/api/policies/{vhost}/{quote(queue, safe='')}-cap"
        policy = {
            "pattern": f"^{re.escape(queue)}$",
            "definition": {"max-length": max_length, "overflow": "reject-publish"},
            "apply-to": "queues",
            "priority": 10,
        }
        requests.put(url, json=policy, auth=self.auth, timeout=10).raise_for_status()
        try:
            wait_for(
                lambda: (
                    self.info(queue).get("effective_policy_definition", {}).get("max-length") == max_length
                ),
                timeout=10,
                what="the policy to apply",
            )
            yield
        finally:
            requests.delete(url, auth=self.auth, timeout=10)

    def delete_all(self) -> None:
        delete_prefixed(self.settings, self.prefix)
