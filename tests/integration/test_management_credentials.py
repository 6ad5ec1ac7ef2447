"""The management API's password never rides in a URL, so no error text can carry it.

``requests`` quotes a call's URL in its errors (``401 Client Error: Unauthorized for url: ...``),
and those texts reach logs, ``jobctl`` output, the demo's summary and any caller's ``str(exc)``.
Against the real management API: a 401 (a wrong password) and a 404 (an unknown queue) raised by
every caller of the API hold the password nowhere, in ``str()``, ``repr()`` or a chained cause.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import pytest
import requests

from jobsystem.settings import Settings, load_settings
from tests.jobctl_run import jobctl

_API = "http://127.0.0.1:15672"


def _variants(secret: str) -> list[str]:
    return [secret, quote(secret, safe=""), secret.casefold()]


def _texts(exc: BaseException) -> str:
    """``str()`` and ``repr()`` of ``exc`` and of every exception chained to it."""
    texts: list[str] = []
    seen: BaseException | None = exc
    while seen is not None and len(texts) < 20:
        texts += [str(seen), repr(seen)]
        seen = seen.__cause__ or seen.__context__
    return "\n".join(texts)


@contextlib.contextmanager
def _management_user(password: str) -> Iterator[str]:
    """A RabbitMQ user of our own with ``password``, allowed the management API (deleted after)."""
    admin = ("guest", "guest")
    user = f"mgmt-{secrets.token_hex(4)}"
    body = {"password": password, "tags": "management"}
    requests.put(f"{_API}/api/users/{user}", json=body, auth=admin, timeout=10).raise_for_status()
    rights = {"configure": ".*", "write": ".*", "read": ".*"}
    try:
        granted = requests.put(f"{_API}/api/permissions/%2F/{user}", json=rights, auth=admin, timeout=10)
        granted.raise_for_status()
        yield user
    finally:
        requests.delete(f"{_API}/api/users/{user}", auth=admin, timeout=10)


@pytest.fixture
def api_user() -> Iterator[tuple[str, str]]:
    """A RabbitMQ user of our own allowed the management API, with a recognisable password."""
    password = f"MgmtPw-{secrets.token_hex(8)}"
    with _management_user(password) as user:
        yield user, password


def _callers(prefix: str) -> dict[str, Callable[[Settings], Any]]:
    """Every caller of the management API, each given a call the API refuses or does not know."""
    from demo.services import delete_named, listed_names
    from jobsystem.ops.management import oldest_age_s, queue_names, queue_stats
    from jobsystem.ops.migration import existing_queues

    return {
        "health stats": lambda s: queue_stats(s, 5),
        "queue names": lambda s: queue_names(s, 5),
        "health peek": lambda s: oldest_age_s(s, f"{prefix}no-such-queue", 5),
        "migration": existing_queues,
        "demo listing": lambda s: listed_names(s, "queues", prefix),
        "demo delete": lambda s: delete_named(s, "exchanges", f"{prefix}no-such-exchange"),
    }


def _assert_hidden(exc: BaseException, password: str) -> None:
    text = _texts(exc)
    for variant in _variants(password):
        assert variant not in text, text


@pytest.mark.parametrize("where", ["RABBITMQ_URL", "RABBITMQ_MANAGEMENT_URL"])
def test_a_refused_password_is_in_no_error_of_any_management_call(prefix, where):
    password = f"Wrong-{secrets.token_hex(8)}"
    env = {**os.environ, "QUEUE_PREFIX": prefix}
    if where == "RABBITMQ_URL":
        env["RABBITMQ_URL"] = f"amqp://guest:{password}@127.0.0.1:5672/%2F"
    else:
        env["RABBITMQ_MANAGEMENT_URL"] = f"http://guest:{password}@127.0.0.1:15672"
    settings = load_settings(env)
    for name, call in _callers(prefix).items():
        with pytest.raises(requests.HTTPError) as raised:
            call(settings)
        assert raised.value.response is not None and raised.value.response.status_code == 401, name
        assert "401 Client Error" in str(raised.value), name
        _assert_hidden(raised.value, password)


def test_an_unknown_queue_is_a_404_whose_error_holds_no_password(prefix, api_user):
    from demo.services import delete_named
    from jobsystem.ops.management import oldest_age_s
    from jobsystem.ops.management_http import call_json

    user, password = api_user
    settings = load_settings(
        {**os.environ, "QUEUE_PREFIX": prefix, "RABBITMQ_URL": f"amqp://{user}:{password}@127.0.0.1:5672/%2F"}
    )
    with pytest.raises(requests.HTTPError, match="404 Client Error") as raised:
        oldest_age_s(settings, f"{prefix}no-such-queue", 5)
    _assert_hidden(raised.value, password)
    # A URL handed over with its credentials has them split off: sent, never quoted.
    with_userinfo = f"http://{user}:{password}@127.0.0.1:15672/api/queues/%2F/{prefix}no-such-queue"
    with pytest.raises(requests.HTTPError, match="404 Client Error") as raised:
        call_json("GET", with_userinfo, 5)
    _assert_hidden(raised.value, password)
    assert call_json("GET", f"http://{user}:{password}@127.0.0.1:15672/api/whoami", 5)["name"] == user
    assert delete_named(settings, "exchanges", f"{prefix}no-such-exchange") is False  # the API answered


def test_jobctl_says_the_management_api_refused_without_the_password(prefix):
    password = f"Wrong-{secrets.token_hex(8)}"
    management = f"http://guest:{password}@127.0.0.1:15672"
    migrated = jobctl(prefix, "migrate-queues", check=False, RABBITMQ_MANAGEMENT_URL=management)
    pinged = jobctl(prefix, "ping", check=False, RABBITMQ_MANAGEMENT_URL=management)
    assert migrated.returncode == 1 and "401 Client Error" in migrated.stderr, migrated.stderr
    assert pinged.returncode == 1 and "HTTPError" in pinged.stdout, pinged.stdout
    for output in (migrated.stdout + migrated.stderr, pinged.stdout + pinged.stderr):
        for variant in _variants(password):
            assert variant not in output, output


@pytest.mark.parametrize("password", ["pässwörd-1234", "mot-de-passe-€-123"], ids=["latin-1", "euro"])
def test_a_password_beyond_ascii_is_accepted_by_the_management_api(prefix, password):
    """RabbitMQ compares the UTF-8 bytes; requests sent str credentials as latin-1 (a 401 for
    "ä", a UnicodeEncodeError holding the password for "€")."""
    from jobsystem.ops.management import queue_names
    from jobsystem.ops.management_http import call_json

    with _management_user(password) as user:
        assert call_json("GET", f"{_API}/api/whoami", 5, auth=(user, password))["name"] == user
        url = f"amqp://{user}:{quote(password, safe='')}@127.0.0.1:5672/%2F"
        settings = load_settings({**os.environ, "QUEUE_PREFIX": prefix, "RABBITMQ_URL": url})
        assert isinstance(queue_names(settings, 5), list)
        pinged = jobctl(prefix, "ping", check=False, RABBITMQ_URL=url)
        assert pinged.returncode == 0, pinged.stdout + pinged.stderr
