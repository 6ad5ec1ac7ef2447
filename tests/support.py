"""Helpers shared by the tests: a real ``dramatiq`` worker subprocess, sending to per-test queues,
reading and deleting those queues through RabbitMQ's management API, and a fresh state store."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import dramatiq
import requests

from jobsystem.rabbitmq.broker import ProjectBroker
from jobsystem.settings import Settings
from jobsystem.store import StateStore, open_store
from jobsystem.store.redis import RedisStore, delete_matching
from jobsystem.system import System, get_system

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

#: The Redis database the tests keep their state in (each test in a namespace of its own).
TEST_REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
#: Workers' RATE_LIMITS unless a test sets its own: the email tests send dozens of mails at once.
TEST_RATE_LIMITS = json.dumps({"smtp": {"rate": 1000, "burst": 1000}})


#: Job states after which nothing more happens to a message (``jobsystem/store/status.py``).
FINISHED_STATES = frozenset({"succeeded", "dead", "skipped", "cancelled"})

#: Worker log events that end one delivery of a message for good: it ran, it was dead-lettered,
#: it was cancelled, or it was a duplicate of a completed idempotency key and dropped.
#: ``job_skipped`` alone is not one: a message deferred (key held, store down, rate limit) is
#: skipped too, and comes back.
FINAL_EVENTS = ("job_succeeded", "job_dead_lettered", "job_cancelled", "duplicate_skipped")


def worker_env(prefix: str, tmp_path: Path, **overrides: str) -> dict[str, str]:
    """The environment of a worker on the test's queues (``prefix``), logging JSON lines."""
    env = dict(os.environ)
    env.update(
        QUEUE_PREFIX=prefix,
        LOG_FORMAT="json",
        REPORTS_DIR=str(tmp_path / "reports"),
        MEDIA_DIR=str(tmp_path / "media"),
        JOB_MIN_BACKOFF_MS="200",
        JOB_MAX_BACKOFF_MS="2000",
        TEST_REDIS_URL=TEST_REDIS_URL,
        STATE_URL=TEST_REDIS_URL,  # each test in a namespace of its own: the QUEUE_PREFIX of its queues
        # No metrics server unless a test asks for one on a free port (9191 may be taken).
        PROMETHEUS_PORT="0",
        RATE_LIMITS=TEST_RATE_LIMITS,
    )
    env.update(overrides)
    return env


def run_worker(
    prefix: str, tmp_path: Path, *, processes: int = 1, **env: str
) -> subprocess.CompletedProcess[str]:
    """``dramatiq actors tests.workload`` run to its end (a worker that must not start), its output
    captured."""
    return subprocess.run(
        [str(BIN / "dramatiq"), "actors", "tests.workload", "-p", str(processes), "-t", "1"],
        cwd=ROOT,
        env=worker_env(prefix, tmp_path, **env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def run_bench(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python -m bench ARGS`` from the repository's root, its output captured as text."""
    root = Path(__file__).resolve().parent.parent
    command = [sys.executable, "-m", "bench", *args]
    return subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=timeout, check=False)


@contextlib.contextmanager
def fresh_store(kind: str, tmp_path: Path) -> Iterator[StateStore]:
    """A state store of ``kind`` (redis: the test Redis, in a namespace of its own, deleted after;
    sqlite: a file under ``tmp_path``). Cleaned up also when the body raises: a test that fails
    inside ``with fresh_store(...)`` would otherwise leave its keys in the test Redis."""
    if kind == "sqlite":
        sqlite = open_store(f"sqlite:///{tmp_path}/state.db")
        try:
            yield sqlite
        finally:
            sqlite.close()
        return
    namespace = f"test-{uuid.uuid4().hex[:8]}:"
    redis = open_store(TEST_REDIS_URL, namespace=namespace)
    assert isinstance(redis, RedisStore)
    try:
        yield redis
    finally:
        delete_matching(redis.client, f"{namespace}*")
        redis.close()


def wait_for(
    predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05, what: str = ""
) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what or predicate}")
        time.sleep(interval)


def within(seconds: float, call: Callable[[], Any]) -> Any:
    """``call()``'s result, or the exception it raised, run in a thread of its own: the test fails
    if it takes longer than ``seconds`` (a call that would hang fails instead of hanging the run;
    the thread is a daemon, which the test's clean-up must let end)."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # handed to the test, interrupts included
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"still running after {seconds:g} s"
    return outcome[0]


T = TypeVar("T")


def finished_within(seconds: float, function: Callable[[], T]) -> T:
    """``function()``'s value, its exception raised, failing the test when it takes longer than
    ``seconds`` (see :func:`within`)."""
    outcome = within(seconds, function)
    if isinstance(outcome, BaseException):
        raise outcome
    value: T = outcome
    return value


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """A process's state letter and parent pid from ``/proc`` (Linux); None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]  # the name in parentheses may hold spaces
    return state, int(ppid)


def running(pid: int) -> bool:
    """Whether ``pid`` still runs: gone, or a zombie (exited, not yet reaped by its new parent), is not."""
    stat = _proc_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def process_tree(pid: int) -> list[int]:
    """``pid``'s descendants, children first, from ``/proc`` (Linux)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _proc_stat(int(entry.name))) is not None:
            parents[int(entry.name)] = stat[1]
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


class Process:
    """A command of the project's environment in a subprocess (a session of its own, run from the
    checkout), its stdout and stderr captured to ``log_path``."""

    def __init__(self, argv: list[str], log_path: Path, env: dict[str, str]) -> None:
        self.log_path = log_path
        self.log = log_path.open("ab")
        self.proc = subprocess.Popen(
            [str(BIN / argv[0]), *argv[1:]],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


class Worker(Process):
    """``dramatiq actors tests.workload`` in a subprocess, with its output captured to a file."""

    def __init__(self, log_path: Path, env: dict[str, str], processes: int = 1, threads: int = 4) -> None:
        self.processes = processes
        argv = ["dramatiq", "actors", "tests.workload", "-p", str(processes), "-t", str(threads)]
        super().__init__(argv, log_path, env)

    def events(self, *names: str, **fields: Any) -> list[dict[str, Any]]:
        """The worker's JSON log lines (``LOG_FORMAT=json``), only those of the events ``names``
        when given, and whose fields have the values given (``message_id=...``)."""
        return [
            line
            for line in json_lines(self.output())
            if (not names or line.get("event") in names) and all(line.get(k) == v for k, v in fields.items())
        ]

    def wait_ready(self, timeout: float = 30.0) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited with {self.proc.returncode}:\n{self.output()}")
            return self.output().count("Worker process is ready for action") >= self.processes

        wait_for(ready, timeout, what="worker start")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Signal the main process only (it forwards to its children) and wait for it to exit."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        finally:
            self.log.close()

    def kill(self) -> None:
        """SIGKILL the whole process group, as a crashed host would."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(os.getpgid(self.proc.pid), signal.SIGKILL)


def json_lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects of ``text``, one a line; other lines (Dramatiq's parent process, a line
    still being written) are left out."""
    lines = []
    for line in text.splitlines():
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict):
                    lines.append(record)
    return lines


def final_events(workers: Iterable[Worker], message_ids: Iterable[str]) -> dict[str, list[str]]:
    """For each of ``message_ids``, the :data:`FINAL_EVENTS` the workers logged for it, in order."""
    found: dict[str, list[str]] = {message_id: [] for message_id in message_ids}
    for worker in workers:
        for line in worker.events(*FINAL_EVENTS):
            if line.get("message_id") in found:
                found[line["message_id"]].append(line["event"])
    return found


def wait_for_final_events(
    workers: Iterable[Worker], deliveries: Mapping[str, int], timeout: float = 60.0
) -> dict[str, Counter[str]]:
    """Wait until each message id in ``deliveries`` has that many final events (one per delivered
    copy: the run, the skipped duplicates, the dead letter) in the workers' logs; returns them
    counted by event name, for the test to assert the exact outcome of every copy.

    Only a delivery that ended has a final event; a copy still prefetched, deferred or held by a
    worker has none yet: unlike a queue's depth, this cannot be reached while work is pending.
    """
    workers = list(workers)

    def done() -> dict[str, Counter[str]] | None:
        found = final_events(workers, deliveries)
        if all(len(found[m]) >= n for m, n in deliveries.items()):
            return {m: Counter(events) for m, events in found.items()}
        return None

    result: dict[str, Counter[str]] = wait_for(
        done, timeout, interval=0.1, what=f"the final events of {dict(deliveries)}"
    )
    return result


#: The brokers :func:`sender_system` built on the test Redis since :func:`flush_senders` last ran.
_SENDERS: list[ProjectBroker] = []


def sender_system(prefix: str, state_url: str) -> System:
    """A system (a :class:`jobsystem.system.System`) on ``prefix`` and ``state_url``, as an
    application or a dashboard would build it: its broker has the project's middleware and knows
    the project's actors (without rebinding them)."""
    from jobsystem.settings import load_settings
    from jobsystem.system import build_system

    system = build_system(load_settings({**os.environ, "QUEUE_PREFIX": prefix, "STATE_URL": state_url}))
    system.broker.actors.update(get_system().broker.actors)
    if state_url == TEST_REDIS_URL:  # what goes elsewhere (a file, a private Redis) is not shared
        _SENDERS.append(system.broker)
    return system


def sender_broker(prefix: str, state_url: str) -> ProjectBroker:
    """The broker of a :func:`sender_system`."""
    return sender_system(prefix, state_url).broker


def flush_senders(timeout: float = 10.0) -> None:
    """Wait until what the brokers :func:`sender_system` built on the test Redis still have to
    write (status records, key completions: written from a background thread after the call that
    made them returned) is there, so that a test's clean-up comes after it; then forget them."""
    while _SENDERS:
        for middleware in _SENDERS.pop().middleware:
            writes = getattr(middleware, "writes", None)
            if writes is not None:
                writes.flush(timeout)


def publish_dead_letters(broker: Any, queue: str, count: int) -> str:
    """``count`` dead letters of ``queue``, published and indexed as a worker's consumer does (the
    record names its queue); returns their ``.DLQ``."""
    for i in range(count):
        message: dramatiq.Message[Any] = dramatiq.Message(queue, "record", (f"d{i}",), {}, {})
        headers = {"x-dl-reason": "retries_exhausted", "x-dl-actor": "record", "x-dl-attempts": 1}
        headers["x-dl-queue"] = queue
        broker.publish_dead_letter(message.encode(), headers, message.message_id, queue)
    assert broker.dead_letter_index.flush(10)
    return queue + ".DLQ"


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
        worker says it is ready before its consumers have declared theirs). A body no queue
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
