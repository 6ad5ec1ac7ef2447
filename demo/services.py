"""What the demo runs around the workload: a mail server, a flaky partner API, the worker and the
scheduler as child processes, and the clean-up of its queues, exchanges and state keys."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests

from demo.alive import alive_queue
from demo.orphan_guard import guarded
from jobsystem.ops.management import call_api
from jobsystem.settings import Settings


class MailServer:
    """An SMTP server in this process (aiosmtpd) that keeps every mail it receives."""

    def __init__(self) -> None:
        self.received: list[Message] = []
        self._lock = threading.Lock()
        outer = self

        class Handler:
            async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
                with outer._lock:
                    outer.received.append(message_from_bytes(envelope.content))
                return "250 Message accepted"

        self._handler = Handler()
        self._controller: Any = None

    def start(self) -> str:
        """Start listening; returns the ``SMTP_URL`` to give the workers. aiosmtpd checks its
        server by connecting to the port it was given, so it needs a real one: a port found free
        can be taken by another socket before the bind, and then another one is tried."""
        from aiosmtpd.controller import Controller

        for attempt in range(1, 4):
            self._controller = Controller(self._handler, hostname="127.0.0.1", port=_free_port())
            try:
                self._controller.start()
            except OSError as error:
                if error.errno != errno.EADDRINUSE or attempt == 3:
                    raise
                continue
            break
        return f"smtp://127.0.0.1:{self._controller.port}"

    def count(self) -> int:
        with self._lock:
            return len(self.received)

    def recipients(self) -> Counter[str]:
        with self._lock:
            return Counter(str(mail["To"]) for mail in self.received)

    def stop(self) -> None:
        if self._controller is not None:
            self._controller.stop()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PartnerApi:
    """A partner's HTTP API, answering 503 while ``up`` is False (the dependency that fails)."""

    def __init__(self) -> None:
        self.up = False
        self.failed = 0
        self.synced: list[int] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                answer: dict[str, Any]
                if api.up:
                    api.synced.append(int(body.get("batch", 0)))
                    status, answer = 200, {"synced": 100}
                else:
                    api.failed += 1
                    status, answer = 503, {"error": "maintenance"}
                payload = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: the live view says what happens."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="partner-api", daemon=True)

    def start(self) -> str:
        self._thread.start()
        return f"http://127.0.0.1:{self._server.server_port}"

    def stop(self) -> None:
        """Stop serving and close the socket; also when never started (``shutdown`` alone would
        wait for ever for a ``serve_forever`` that never ran)."""
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()


class Child:
    """A child process (the worker or the scheduler) in a session of its own, so Ctrl-C in the
    terminal reaches only the demo, which then stops it with one SIGTERM to its main process.
    Started through :mod:`demo.orphan_guard`, it gets that SIGTERM from the kernel if the demo
    dies without stopping it (SIGKILL). Start it from the main thread: the signal comes when the
    thread that started it ends. It inherits the descriptors ``held`` (the lock on the demo's
    folder, :func:`demo.folders.hold_folder`): the folder is not taken for dead while it runs."""

    def __init__(
        self, name: str, argv: list[str], env: dict[str, str], log_path: Path, held: tuple[int, ...] = ()
    ) -> None:
        self.name = name
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.proc = subprocess.Popen(
            guarded(argv),
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            pass_fds=held,
        )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float) -> int | None:
        """SIGTERM to the main process only (dramatiq forwards it to its worker processes; a
        second signal would mean "stop now"); SIGKILL the group only if it outlives ``timeout``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(10)
        finally:
            self._log.close()


def start_worker(
    env: dict[str, str], log_path: Path, modules: list[str], held: tuple[int, ...] = ()
) -> Child:
    """``jobctl worker`` (``dramatiq actors`` with the configured processes and threads)."""
    return Child("worker", [_script("jobctl"), "worker", *modules], env, log_path, held)


def start_scheduler(
    env: dict[str, str], log_path: Path, schedules: Path, held: tuple[int, ...] = ()
) -> Child:
    """``python -m scheduler`` on the demo's schedules file."""
    argv = [sys.executable, "-m", "scheduler", "--schedules", str(schedules)]
    return Child("scheduler", argv, env, log_path, held)


def _script(name: str) -> str:
    """A console script of this environment (next to the running interpreter), else from PATH."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def worker_ready(worker: Child, processes: int) -> bool:
    """True once every worker process logged that it is ready; raises if the worker exited."""
    if not worker.alive():
        raise RuntimeError(
            f"the worker exited with code {worker.proc.returncode}:\n{worker.output()[-3000:]}"
        )
    return worker.output().count("Worker process is ready for action") >= processes


def count_events(log_path: Path, event: str) -> int:
    """How many JSON log lines of ``log_path`` are ``event`` (e.g. ``rate_limited``)."""
    needle = f'"{event}"'
    total = 0
    with contextlib.suppress(FileNotFoundError), log_path.open(errors="replace") as lines:
        for line in lines:
            if needle in line:
                with contextlib.suppress(ValueError):
                    total += json.loads(line[line.index("{") :]).get("event") == event
    return total


def _api(settings: Settings, kind: str, *name: str) -> str:
    """The management API's list of ``kind`` (``queues``, ``exchanges``) on the vhost, or one."""
    return settings.management_api(kind, settings.rabbitmq_vhost, *name)


def listed_names(settings: Settings, kind: str, prefix: str) -> list[str]:
    """The names of the ``kind`` (``queues``, ``exchanges``) starting with ``prefix``."""
    listed = call_api(settings, "GET", _api(settings, kind), 10, params={"columns": "name"})
    return [item["name"] for item in listed if item["name"].startswith(prefix)]


def delete_named(settings: Settings, kind: str, name: str) -> bool:
    """Delete one queue or exchange by the management API; False if it was already gone (another
    demo's sweep may delete the same leftovers at the same time)."""
    try:
        call_api(settings, "DELETE", _api(settings, kind, name), 10)
    except requests.HTTPError as exc:
        if exc.response is not None and exc.response.status_code == 404:
            return False
        raise
    return True


#: The only prefixes the clean-up deletes under: the demo's own, never an environment's.
DEMO_PREFIX = re.compile(r"demo-[0-9a-f]{6}-")


def _check_prefix(settings: Settings, prefix: str) -> None:
    if not DEMO_PREFIX.fullmatch(prefix) or settings.queue_prefix != prefix:
        raise ValueError(f"refusing to delete under {settings.queue_prefix!r}: not this demo's prefix")


def prefixed_queues(settings: Settings, prefix: str) -> list[str]:
    """The queues whose name starts with ``prefix`` (work, ``.DQ`` and ``.DLQ`` queues), but its
    alive queue: that one goes when the demo's connection closes, once all else is deleted."""
    return [q for q in listed_names(settings, "queues", prefix) if q != alive_queue(prefix)]


def abandon_connection(broker: Any) -> None:
    """Forget this thread's connection and channel of ``broker`` without a word to RabbitMQ.

    Ctrl-C in the middle of an AMQP call leaves the channel waiting for a reply it will not match:
    any later call on it blocks for ever, closing it included (a channel's close is a call, and so
    is a connection's, which closes its channels first). Seen: the demo never exited. Forgotten,
    it is closed with the process, and whatever runs next in this thread opens a new one."""
    state = broker.state
    channel = getattr(state, "channel", None)
    if channel is not None:
        del state.channel
        broker.channels.discard(channel)
    connection = getattr(state, "connection", None)
    if connection is not None:
        del state.connection
        broker.connections.discard(connection)


def delete_topology(settings: Settings, prefix: str, declared: list[str]) -> tuple[list[str], list[str]]:
    """Delete the demo's queues: those the management API lists under ``prefix``, else (API down)
    the declared ones with their ``.DQ``/``.DLQ``; then its delay cascade's exchanges, which
    deleting the queues leaves behind. Returns the names of the queues and of the exchanges."""
    import pika

    from jobsystem.rabbitmq.broker import DEAD_LETTER_SUFFIX, connection_urls
    from jobsystem.rabbitmq.delays import DelayCascade
    from jobsystem.runtime.connecting import open_connection

    _check_prefix(settings, prefix)
    over_amqp: list[str] = []  # the queues to delete over AMQP: all of them when the API is down
    try:
        queues = prefixed_queues(settings, prefix)
        for name in queues:
            delete_named(settings, "queues", name)
    except requests.RequestException:
        suffixes = ("", ".DQ", DEAD_LETTER_SUFFIX)
        queues = over_amqp = [f"{q}{suffix}" for q in declared if q.startswith(prefix) for suffix in suffixes]
    exchanges = DelayCascade(prefix).exchanges()
    connection = open_connection(pika.URLParameters(connection_urls(settings)[0]))
    try:
        channel = connection.channel()
        for name in over_amqp:
            channel.queue_delete(name)
        for name in exchanges:
            channel.exchange_delete(name)  # none there (a demo stopped early) is no error
    finally:
        connection.close()
    return queues, exchanges


def delete_state_keys(settings: Settings, prefix: str) -> int:
    """Delete the demo's keys from a Redis state store (SCAN + UNLINK on its namespace); a SQLite
    store is a temporary file the demo removes with its folder."""
    _check_prefix(settings, prefix)
    if not settings.state_url.startswith(("redis://", "rediss://")):
        return 0
    import redis

    from jobsystem.store.redis import delete_matching

    client = redis.Redis.from_url(settings.state_url, socket_timeout=settings.state_timeout)
    try:
        return delete_matching(client, f"{settings.state_namespace}*")
    finally:
        client.close()


#: What the demo says when RabbitMQ did not answer: a fixed line, naming no host, port or user
#: (and one line of a terminal 80 columns wide, after "demo stopped: ").
RABBITMQ_SILENT = "RabbitMQ did not answer: is it running? `make services` starts it"


def error_line(settings: Settings, exc: BaseException) -> str:
    """``exc`` as the demo prints it and writes it to its summary: its type, and its text passed
    through the project's scrubber (a client's error may quote a host, a user or a queue's name,
    and the scrubber knows the configured passwords).

    RabbitMQ down (nothing listening, or no route to it) is :data:`RABBITMQ_SILENT`: pika then
    raises a bare ``AMQPConnectionError`` whose text is empty (its one argument prints nothing),
    and the demo printed ``AMQPConnectionError: `` and no hint. Its subclasses carry RabbitMQ's
    answer (a refused login, an unknown vhost) and keep their scrubbed text, but
    :class:`HandshakeTimeout` (a RabbitMQ that took the connection and never answered)."""
    from pika.exceptions import AMQPConnectionError

    from jobsystem.privacy.setup import get_scrubber
    from jobsystem.runtime.connecting import HandshakeTimeout

    if type(exc) is AMQPConnectionError or isinstance(exc, HandshakeTimeout):
        return RABBITMQ_SILENT
    return f"{type(exc).__name__}: {get_scrubber(settings).text(str(exc))}"


def wait_until(predicate: Any, timeout: float, interval: float = 0.2) -> bool:
    """Poll ``predicate`` until true; False after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True
