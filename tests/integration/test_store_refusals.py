"""A state store that answers but refuses this configuration, against the real ``jobctl`` and the
real dashboard: a wrong password or none (redis-py's AuthenticationError, from an AUTH to a Redis
without a password, ``NOAUTH`` and ``WRONGPASS``), a Redis that cannot save its snapshot
(``MISCONF``). The dashboard's pages called it "unreachable" (and ``jobctl`` named no setting to
check), sending the operator after a network fault; "unreachable" is now for a store that did not
answer at all. The password of the URL is never shown."""

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
REFUSED = "state store misconfigured (AuthenticationError); check STATE_URL"
#: The pages that read the state store, and an action that does before it runs.
PAGES = ["/jobs", "/jobs/m1", "/workers", "/audit", "/rate-limits"]


def _test_redis_with(password: str) -> str:
    """The test Redis (it has no password: an AUTH with one is refused too) logged in to with ``password``."""
    parts = urlsplit(TEST_REDIS_URL)
    return f"redis://:{password}@{parts.hostname}:{parts.port or 6379}{parts.path}"


@pytest.fixture
def guarded() -> Iterator[PrivateRedis]:
    """A Redis of the test's own with a password."""
    server = PrivateRedis(password=PASSWORD)
    yield server
    server.stop()


def _last_line(run: object) -> str:
    return str(getattr(run, "stderr", "")).strip().splitlines()[-1]


def test_jobctl_says_a_store_that_refuses_the_login_is_misconfigured(prefix: str, guarded: PrivateRedis) -> None:
    refusals = {
        "AUTH to a Redis without a password": _test_redis_with(WRONG),
        "NOAUTH": f"redis://127.0.0.1:{guarded.port}/0",
        "WRONGPASS": f"redis://:{WRONG}@127.0.0.1:{guarded.port}/0",
    }
    for how, url in refusals.items():
        status = jobctl(prefix, "status", "m1", check=False, STATE_URL=url)
        assert status.returncode == 2 and _last_line(status) == f"jobctl: {REFUSED}", (how, status.stderr)
        health = jobctl(prefix, "health", check=False, STATE_URL=url)
        detail = "  state store misconfigured, no totals (AuthenticationError); check STATE_URL"
        assert detail in health.stdout.splitlines(), (how, health.stdout, health.stderr)
        for run in (status, health):
            assert WRONG not in run.stdout + run.stderr and PASSWORD not in run.stdout + run.stderr


def test_jobctl_says_a_store_that_does_not_answer_is_unreachable(prefix: str) -> None:
    status = jobctl(prefix, "status", "m1", check=False, STATE_URL=f"redis://:{WRONG}@127.0.0.1:{free_port()}/15")
    assert status.returncode == 2
    assert _last_line(status) == "jobctl: state store unreachable (ConnectionError)", status.stderr
    assert WRONG not in status.stdout + status.stderr


def test_jobctl_says_a_redis_that_cannot_save_its_snapshot_is_misconfigured(prefix: str, tmp_path: Path) -> None:
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
    dashboard = start_dashboard(STATE_URL=_test_redis_with(WRONG))
    for path in [*PAGES, *(f"/api{p}" for p in PAGES)]:
        page = dashboard.get(path, ADMIN)
        assert page.status_code == 503 and REFUSED in page.text, (path, page.status_code, page.text)
        assert "unreachable" not in page.text and WRONG not in page.text, (path, page.text)
    notes = dashboard.get("/api/queues", ADMIN).json()["notes"]
    assert "state store misconfigured, no totals (AuthenticationError); check STATE_URL" in notes, notes
    assert "state store misconfigured, no charts (AuthenticationError); check STATE_URL" in notes, notes
    token = dashboard.get("/api/csrf", ADMIN).json()["token"]
    answer = dashboard.post("/api/jobs/m1/cancel", ADMIN, {}, token=token)
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"] == "state store misconfigured, nothing done (AuthenticationError); check STATE_URL"
    assert WRONG not in dashboard.output()
