"""Secrets from the settings and key names at rest: what issue 13 found leaking, shown closed.

- An SMTP password in ``SMTP_URL`` never appears in a log line, a Sentry event, a dead letter or
  ``jobctl`` output, when the SMTP server refuses it (Sentry's frame locals hold ``urlsplit()``
  of the URL, whose ``netloc`` is ``user:password@host``).
- A RabbitMQ password in ``RABBITMQ_URL`` never appears in ``jobctl`` output or a worker's log,
  when the broker refuses it or the management API answers 401 or 404.
- After the reference email actor ran, no recipient address is readable in the state store's
  key names, and ``lookup()`` still finds the key.
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import requests

from actors import emails
from tests.servers import free_port, self_signed_certificate, sentry_events, sentry_server, server_tls
from tests.support import BIN, ROOT, TEST_REDIS_URL, wait_for, worker_env
from tests.workers import Worker


def _jobctl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "jobctl"), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def _variants(secret: str) -> list[str]:
    from urllib.parse import quote

    return [secret, quote(secret, safe=""), secret.casefold()]


@pytest.fixture
def refusing_smtp(tmp_path) -> Iterator[tuple[int, str]]:
    """An SMTP server that offers STARTTLS, then AUTH, and refuses every login (535); yields its
    port and the certificate file a client must trust (``SSL_CERT_FILE``)."""
    from aiosmtpd.controller import Controller
    from aiosmtpd.smtp import AuthResult

    class Handler:
        async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
            return "250 accepted"

    def refuse(server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> AuthResult:
        return AuthResult(success=False, handled=False)

    cert, key = self_signed_certificate(tmp_path)
    port = free_port()
    controller = Controller(
        Handler(),
        hostname="127.0.0.1",
        port=port,
        authenticator=refuse,
        tls_context=server_tls(cert, key),
        require_starttls=True,
    )
    controller.start()
    try:
        yield port, str(cert)
    finally:
        controller.stop()


def test_smtp_password_never_leaves_when_smtp_refuses_it(
    start_worker, queues, prefix, tmp_path, refusing_smtp
):
    password = f"Sm7p-{secrets.token_urlsafe(12)}"
    port, cert = refusing_smtp  # credentials go over TLS only (SMTP_URL is checked)
    with sentry_server() as (dsn, envelopes):
        worker = start_worker(
            SMTP_URL=f"smtp://mailer:{password}@127.0.0.1:{port}?starttls=1",
            SSL_CERT_FILE=cert,
            SENTRY_DSN=dsn,
            JOB_MAX_RETRIES="1",
            SMTP_TIMEOUT="5",
        )
        message = queues.send(emails.send_email, to="maria.garcia@example.es", template="welcome")
        dead = queues.name(emails.send_email) + ".DLQ"
        wait_for(lambda: queues.depth(dead) == 1, what="the dead letter")

        def reported() -> list[dict[str, Any]]:
            events = sentry_events(list(envelopes))
            return [e for e in events if e.get("tags", {}).get("message_id") == message.message_id]

        events = wait_for(lambda: len(reported()) == 2 and reported(), what="both attempts in Sentry")
        assert worker.stop() == 0
        received = b"".join(envelopes).decode("utf-8", "replace")
    headers = json.dumps(queues.peek(dead)[0]["properties"]["headers"])
    env = worker_env(
        prefix, tmp_path, SMTP_URL=f"smtp://mailer:{password}@127.0.0.1:1?starttls=1", LOG_LEVEL="WARNING"
    )
    shown = _jobctl(env, "dlq", "show", message.message_id)
    operator = shown.stdout + shown.stderr + _jobctl(env, "dlq", "list").stdout
    assert "SMTPAuthenticationError" in headers and "SMTPAuthenticationError" in operator
    # Sentry got the failure with the actor's locals, the URL among them summed up: no text at all.
    frames = [f for e in events for v in e["exception"]["values"] for f in v["stacktrace"]["frames"]]
    (client_frame, *_) = [f for f in frames if f.get("function") == "_smtp_client"]
    url = client_frame["vars"]["url"]
    parts = url if isinstance(url, list) else [url]
    assert parts and all(re.fullmatch(r"\[text, \d+ chars\]", part) for part in parts), url
    assert all("vars" not in f for f in frames if f["module"].startswith("smtplib"))
    for output in (worker.output(), received, headers, operator):
        for variant in _variants(password):
            assert variant not in output


@pytest.fixture
def rabbit_user() -> Iterator[tuple[str, str]]:
    """A RabbitMQ user of our own with a random password, deleted afterwards."""
    api = "http://guest:guest@127.0.0.1:15672/api"
    user, password = f"privacy-{secrets.token_hex(4)}", f"Rb-{secrets.token_urlsafe(14)}"
    requests.put(
        f"{api}/users/{user}", json={"password": password, "tags": ""}, timeout=10
    ).raise_for_status()
    requests.put(
        f"{api}/permissions/%2F/{user}", json={"configure": ".*", "write": ".*", "read": ".*"}, timeout=10
    ).raise_for_status()
    try:
        yield user, password
    finally:
        requests.delete(f"{api}/users/{user}", timeout=10)


def test_rabbitmq_password_never_leaves_when_broker_or_management_api_refuse(prefix, tmp_path, rabbit_user):
    user, password = rabbit_user
    good = f"amqp://{user}:{password}@127.0.0.1:5672/%2F"
    wrong = f"amqp://{user}:{password}-but-wrong@127.0.0.1:5672/%2F"
    outputs = []
    # The broker refuses the login: every command that connects says so, without the password.
    env = worker_env(prefix, tmp_path, RABBITMQ_URL=wrong)
    for command in (["ping"], ["health"], ["dlq", "list"], ["migrate-queues"]):
        result = _jobctl(env, *command)
        assert result.returncode != 0, command
        outputs.append(result.stdout + result.stderr)
    assert "ProbableAuthenticationError" in outputs[0] or "ACCESS_REFUSED" in outputs[0]
    # The broker accepts, the management API refuses: 401 (no management tag), 4xx (wrong path).
    for management, status in (
        ("http://127.0.0.1:15672", "401"),
        ("http://127.0.0.1:15672/x", "Client Error"),
    ):
        env = worker_env(prefix, tmp_path, RABBITMQ_URL=good, RABBITMQ_MANAGEMENT_URL=management)
        result = _jobctl(env, "migrate-queues")
        assert result.returncode != 0 and status in result.stdout + result.stderr
        outputs.append(result.stdout + result.stderr + _jobctl(env, "ping").stdout)
    # A worker the broker refuses says why, over and over (at DEBUG: pika's own lines too).
    log = tmp_path / "refused-worker.log"
    worker = Worker(log, worker_env(prefix, tmp_path, RABBITMQ_URL=wrong, LOG_LEVEL="DEBUG"))
    wait_for(lambda: worker.output().count("ACCESS_REFUSED") >= 3, what="the broker's refusals")
    worker.stop()
    outputs.append(worker.output())
    for output in outputs:
        for variant in _variants(password):
            assert variant not in output, output


def test_no_recipient_address_in_state_store_key_names(start_worker, queues, prefix):
    from tests.servers import smtp_server

    addresses = ["maria.garcia@example.es", "Søren.Ødegård@eksempel.dk"]
    with smtp_server() as (port, _received):
        worker = start_worker(SMTP_URL=f"smtp://127.0.0.1:{port}")
        for to in addresses:
            queues.send(emails.send_email, to=to, template="welcome", context={"name": "Maria"})
        wait_for(lambda: worker.output().count("job_succeeded") == 2, what="both mails")
    client = redis.Redis.from_url(TEST_REDIS_URL)
    names = [key.decode() for key in client.scan_iter(f"jobs:{prefix}*", count=1000)]
    keyed = [name for name in names if "idem2:send_email:" in name]
    assert len(keyed) == 2 and all(re.fullmatch(r".*:send_email:[0-9a-f]{32}", name) for name in keyed)
    for address in addresses:
        for part in (address, address.split("@")[0], address.casefold().split("@")[0]):
            assert not any(part in name for name in names)
            assert part.casefold() not in worker.output().casefold()
    # The key is still found under its clear value: lookup() hashes it the same way.
    idempotency = next(m for m in queues.broker.middleware if hasattr(m, "lookup"))
    record = idempotency.lookup("send_email", emails.email_key(addresses[0], "welcome"))
    assert record is not None and record.state == "done"
    # A duplicate send is logged by its hashed key only.
    duplicate = queues.send(emails.send_email, to=addresses[0], template="welcome", context={"name": "Maria"})
    assert duplicate.options.get("duplicate") is True
