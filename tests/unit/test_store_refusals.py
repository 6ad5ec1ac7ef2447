"""A state store that answers but refuses this configuration (a wrong password or ACL: redis-py's
AuthenticationError from ``NOAUTH`` or ``WRONGPASS``, ``NOPERM``; a
SQLite folder that cannot be made; a Redis that cannot save its snapshot: ``MISCONF``) was said
"unreachable" by every page and action of the dashboard: the operator went looking for a network
fault. It is "misconfigured", naming what to check (``STATE_URL`` by name, never its value);
another answer (``OOM``, ``READONLY``) is "refused the request"; "unreachable" is left for a store
that did not answer at all. A page that cannot be had is still a 503."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
from redis._parsers.base import BaseParser

from jobsystem.ops.deadline import Late
from jobsystem.ops.outages import store_failed, store_outage
from jobsystem.store import StateStore, open_store
from jobsystem.store.base import StoreUnavailable
from jobsystem.store.redis import redis_error
from tests.asgi import call
from tests.servers import free_port
from tests.support import TEST_REDIS_URL
from tests.unit.test_dashboard_app import dashboard

#: A password of a user the test Redis does not have. (Its default user has no password, and
#: takes any: redis-py logs in with ``HELLO 3 AUTH default PASSWORD``, not the legacy ``AUTH
#: PASSWORD`` that such a Redis answers with an error.)
USER, WRONG = "nobody", "not-the-Pa55word"
DISK = "the Redis server's disk and its snapshot settings (dir, stop-writes-on-bgsave-error)"


def _reply(text: str) -> redis.RedisError:
    """An error reply as redis-py parses it off the wire."""
    return BaseParser.parse_error(text)  # type: ignore[no-untyped-call,no-any-return]


def _from(exc: redis.RedisError) -> StoreUnavailable:
    """The store error the Redis store raises for ``exc``."""
    return redis_error(exc)


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (
            _from(_reply("WRONGPASS invalid username-password pair or user is disabled.")),
            "state store misconfigured (AuthenticationError WRONGPASS); check STATE_URL",
        ),
        (
            _from(_reply("NOAUTH Authentication required.")),
            "state store misconfigured (AuthenticationError NOAUTH); check STATE_URL",
        ),
        (
            _from(_reply("NOPERM User app has no permissions to run the 'hset' command")),
            "state store misconfigured (NoPermissionError NOPERM); check STATE_URL",
        ),
        (
            _from(_reply("MISCONF Redis is configured to save RDB snapshots, but it's currently unable")),
            f"state store misconfigured (ResponseError MISCONF); check {DISK}",
        ),
        (_from(_reply("OOM command not allowed")), "state store refused the request (OutOfMemoryError OOM)"),
        (
            _from(_reply("READONLY You can't write")),
            "state store refused the request (ReadOnlyError READONLY)",
        ),
        (
            _from(redis.ConnectionError("Error 111 connecting to 10.0.0.5:6379. Connection refused.")),
            "state store unreachable (ConnectionError)",
        ),
        (
            _from(redis.TimeoutError("Timeout reading from 10.0.0.5:6379")),
            "state store unreachable (TimeoutError)",
        ),
        (Late("no answer within 5 s"), "state store unreachable (no answer within 5 s)"),
        (StoreUnavailable("redis: down"), "state store unreachable (StoreUnavailable)"),
    ],
)
def test_a_store_is_said_misconfigured_when_it_refused_and_unreachable_only_when_silent(
    error: BaseException, said: str
) -> None:
    assert store_outage(error) == said
    assert "10.0.0.5" not in store_outage(error, "no totals")


def test_a_stopped_dead_letter_operation_says_the_store_refused_not_that_it_did_not_answer() -> None:
    refused = _from(_reply("WRONGPASS invalid username-password pair or user is disabled."))
    assert store_failed(refused, "the replays' idempotency check") == (
        "the state store refused the replays' idempotency check, misconfigured: check STATE_URL"
    )
    silent = _from(redis.ConnectionError("Error 111 connecting to 10.0.0.5:6379. Connection refused."))
    assert store_failed(silent) == "the state store did not answer"


def test_a_sqlite_store_whose_folder_cannot_be_made_is_misconfigured(tmp_path: Path) -> None:
    """The store makes a missing folder; one that cannot be made (here a file is in the way; a
    read-only parent) leaves no database to open."""
    (tmp_path / "not-a-folder").write_text("")
    store = open_store(f"sqlite:///{tmp_path}/not-a-folder/state.db")
    try:
        with pytest.raises(StoreUnavailable) as failure:
            store.check()
    finally:
        store.close()
    assert store_outage(failure.value).startswith("state store misconfigured (")
    assert store_outage(failure.value).endswith("; check STATE_URL")


@pytest.fixture(params=["wrong password", "nothing listening"])
def refusing(request: pytest.FixtureRequest) -> Iterator[tuple[StateStore, str]]:
    """The test Redis logged in to with a wrong password (it answers: misconfigured), or a port
    where nothing listens (unreachable), and what the pages must call it."""
    parts = urlsplit(TEST_REDIS_URL)
    if request.param == "wrong password":
        url, said = (
            f"redis://{USER}:{WRONG}@{parts.hostname}:{parts.port or 6379}{parts.path}",
            "misconfigured",
        )
    else:
        url, said = f"redis://127.0.0.1:{free_port()}/15", "unreachable"
    store = open_store(url, namespace="test-refusals:")
    yield store, said
    store.close()


@pytest.mark.parametrize("path", ["/jobs", "/jobs/m1", "/workers", "/audit", "/rate-limits"])
def test_every_page_names_a_refusing_store_misconfigured_and_a_silent_one_unreachable(
    refusing: tuple[StateStore, str], path: str
) -> None:
    store, said = refusing
    app, _, _ = dashboard(store)
    for target in (path, f"/api{path}"):
        page = call(app, "GET", target)
        assert page.status_code == 503, (target, page.text)
        assert f"state store {said} (" in page.text, page.text
        assert ("check STATE_URL" in page.text) is (said == "misconfigured"), page.text
        assert WRONG not in page.text


def test_an_action_on_a_refusing_store_says_misconfigured_and_nothing_done(
    refusing: tuple[StateStore, str],
) -> None:
    store, said = refusing
    app, _, post = dashboard(store)
    answer = call(app, "POST", "/api/jobs/m1/cancel", {}, post)
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"].startswith(f"state store {said}, nothing done ("), answer.text
    assert WRONG not in answer.text
