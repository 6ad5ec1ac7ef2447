"""A state store that answers but refuses this configuration, against the real ``jobctl`` and the
real dashboard: a wrong password or none (redis-py's AuthenticationError, from ``NOAUTH`` and
``WRONGPASS``), a Redis that cannot save its snapshot (``MISCONF``). The dashboard's pages called
it "unreachable" (and ``jobctl`` named no setting to check), sending the operator after a network
fault; "unreachable" is now for a store that did not answer at all. The URL's password is never
shown.

A wrong password for the test Redis, which has none, is not refused: redis-py logs in with
``HELLO 3 AUTH default PASSWORD``, which a default user without a password accepts whatever the
password (only the legacy ``AUTH PASSWORD`` is answered with an error); a user it does not have is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.dashboard_server import DASHBOARD_ADMIN, Dashboard
from tests.integration.test_store_faults import PrivateRedis
from tests.jobctl_run import jobctl
from tests.servers import free_port
from tests.support import TEST_REDIS_URL, wait_for

ADMIN = ("admin", DASHBOARD_ADMIN)
#: The private Redis's password, and one no Redis here has.
PASSWORD, WRONG = "the-Pa55word-of-the-private-redis", "not-the-Pa55word"
#: How a refused login is said, before and after the reply's code (NOAUTH, WRONGPASS).
REFUSED = ("state store misconfigured (AuthenticationError ", "); check STATE_URL")
#: The pages that read the state store, and an action that does before it runs.
PAGES = ["/jobs", "/jobs/m1", "/workers", "/audit", "/rate-limits"]


def _test_redis_as_nobody() -> str:
    """The test Redis logged in to as a user it does not have."""
    parts = urlsplit(TEST_REDIS_URL)
    return f"redis://nobody:{WRONG}@{parts.hostname}:{parts.port or 6379}{parts.path}"


def _refused(text: str) -> bool:
    """Whether ``text`` says the store refused the login (misconfigured, check STATE_URL)."""
    start, end = REFUSED
    return start in text and end in text.split(start, 1)[1]


@pytest.fixture
def guarded() -> Iterator[PrivateRedis]:
    """A Redis of the test's own with a password."""
    server = PrivateRedis(password=PASSWORD)
    yield server
    server.stop()


def _last_line(run: object) -> str:
    return str(getattr(run, "stderr", "")).strip().splitlines()[-1]


def test_jobctl_says_a_store_that_refuses_the_login_is_misconfigured(
    prefix: str, guarded: PrivateRedis
) -> None:
    refusals = {
        "a user the Redis does not have": _test_redis_as_nobody(),
        "NOAUTH": f"redis://127.0.0.1:{guarded.port}/0",
        "WRONGPASS": f"redis://:{WRONG}@127.0.0.1:{guarded.port}/0",
    }
    for how, url in refusals.items():
        status = jobctl(prefix, "status", "m1", check=False, STATE_URL=url)
        last = _last_line(status)
        assert status.returncode == 2 and last.startswith(f"jobctl: {REFUSED[0]}"), (how, status.stderr)
        assert last.endswith(REFUSED[1]), (how, status.stderr)
        health = jobctl(prefix, "health", check=False, STATE_URL=url)
        detail = "  state store misconfigured, no totals (AuthenticationError "
        assert any(line.startswith(detail) for line in health.stdout.splitlines()), (how, health.stdout)
        for run in (status, health):
            assert WRONG not in run.stdout + run.stderr and PASSWORD not in run.stdout + run.stderr


def test_jobctl_says_a_store_that_does_not_answer_is_unreachable(prefix: str) -> None:
    status = jobctl(
        prefix, "status", "m1", check=False, STATE_URL=f"redis://:{WRONG}@127.0.0.1:{free_port()}/15"
    )
    assert status.returncode == 2
    assert _last_line(status) == "jobctl: state store unreachable (ConnectionError)", status.stderr
    assert WRONG not in status.stdout + status.stderr


def test_jobctl_says_a_redis_that_cannot_save_its_snapshot_is_misconfigured(
    prefix: str, tmp_path: Path
) -> None:
    """Redis refuses writes (``MISCONF``) once a snapshot failed, here because its folder is gone."""
    folder = tmp_path / "rdb"
    folder.mkdir()
    server = PrivateRedis("--dir", str(folder))
    try:
        folder.rmdir()
        server.client.config_set("save", "3600 1")
        server.client.bgsave()
        wait_for(
            lambda: server.client.info("persistence")["rdb_last_bgsave_status"] == "err",
            timeout=10,
            what="the snapshot to fail",
        )
        cancel = jobctl(prefix, "cancel", "m1", check=False, STATE_URL=server.url)
    finally:
        server.stop()
    assert cancel.returncode == 2, cancel.stdout + cancel.stderr
    assert _last_line(cancel) == (
        "jobctl: state store misconfigured (ResponseError MISCONF); check the Redis server's disk and its"
        " snapshot settings (dir, stop-writes-on-bgsave-error)"
    )


def test_the_dashboard_says_a_store_that_refuses_the_login_is_misconfigured(
    start_dashboard: Callable[..., Dashboard],
) -> None:
    dashboard = start_dashboard(STATE_URL=_test_redis_as_nobody())
    for path in [*PAGES, *(f"/api{p}" for p in PAGES)]:
        page = dashboard.get(path, ADMIN)
        assert page.status_code == 503 and _refused(page.text), (path, page.status_code, page.text)
        assert "unreachable" not in page.text and WRONG not in page.text, (path, page.text)
    notes = dashboard.get("/api/queues", ADMIN).json()["notes"]
    code = "(AuthenticationError WRONGPASS); check STATE_URL"
    assert f"state store misconfigured, no totals {code}" in notes, notes
    assert f"state store misconfigured, no charts {code}" in notes, notes
    token = dashboard.get("/api/csrf", ADMIN).json()["token"]
    answer = dashboard.post("/api/jobs/m1/cancel", ADMIN, {}, token=token)
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"] == f"state store misconfigured, nothing done {code}", answer.text
    assert WRONG not in dashboard.output()
