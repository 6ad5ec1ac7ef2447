"""The dashboard over HTTP against a real `jobctl dashboard`, real workers, RabbitMQ and Redis:
log-in on every path, roles, cross-site POSTs, secrets kept out of logs, the JSON endpoints, and
dead-letter actions that replay without loss and are audited."""

from __future__ import annotations

import os
import subprocess
from typing import Any

import pika
import pytest

from tests import workload
from tests.dashboard_server import DASHBOARD_ADMIN, DASHBOARD_VIEWER
from tests.support import BIN, ROOT, wait_for

ADMIN = ("admin", DASHBOARD_ADMIN)
VIEWER = ("viewer", DASHBOARD_VIEWER)
PAGES = ["/", "/jobs", "/jobs/some-id", "/dead-letters", "/schedules", "/rate-limits", "/workers", "/audit"]
APIS = [
    "/api/queues",
    "/api/jobs",
    "/api/jobs/some-id",
    "/api/dead-letters",
    "/api/schedules",
    "/api/rate-limits",
    "/api/workers",
    "/api/audit",
    "/api/csrf",
]
ACTIONS = [
    "/api/dead-letters/retry",
    "/api/dead-letters/purge",
    "/api/dead-letters/reindex",
    "/api/jobs/some-id/retry",
]


def test_it_refuses_to_start_without_an_admin_password(prefix):
    env = {**os.environ, "QUEUE_PREFIX": prefix, "DASHBOARD_ADMIN_PASSWORD": ""}
    run = subprocess.run(
        [str(BIN / "jobctl"), "dashboard"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 2
    assert run.stderr.strip().splitlines()[-1] == (
        "jobctl: invalid setting DASHBOARD_ADMIN_PASSWORD: required to start the dashboard"
    )
    short = subprocess.run(
        [str(BIN / "jobctl"), "dashboard"],
        cwd=ROOT,
        env={**env, "DASHBOARD_ADMIN_PASSWORD": "short-pw"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert short.returncode == 2 and "invalid setting DASHBOARD_ADMIN_PASSWORD" in short.stderr
    assert "short-pw" not in short.stderr + short.stdout


def test_every_path_asks_for_credentials_and_the_viewer_cannot_act(start_dashboard):
    dashboard = start_dashboard()
    wrong = [None, ("admin", "not-the-password"), ("viewer", DASHBOARD_ADMIN), ("root", DASHBOARD_ADMIN)]
    for path in [*PAGES, *APIS, "/static/app.css", "/static/app.js", "/no/such/page"]:
        for auth in wrong:
            response = dashboard.get(path, auth)
            assert response.status_code == 401, (path, auth, response.status_code)
            assert response.headers["WWW-Authenticate"].startswith("Basic ")
    for path in ACTIONS:
        assert dashboard.post(path, ("admin", "nope"), {}, token="x").status_code == 401
    for path in [*PAGES, *APIS]:
        expected = 404 if "some-id" in path else 200
        assert dashboard.get(path, VIEWER).status_code == expected, path
        assert dashboard.get(path, ADMIN).status_code == expected, path
    for path in ACTIONS:
        refused = dashboard.post(path, VIEWER, {"queue": "x", "all": True})
        assert refused.status_code == 403 and "read-only" in refused.json()["error"]
    assert 'class="act' not in dashboard.get("/dead-letters", VIEWER).text


def test_cross_site_posts_are_refused(start_dashboard, queues):
    dashboard = start_dashboard()
    queues.broker.declare_queue(queues.name(workload.depends), ensure=True)
    token = dashboard.get("/api/csrf", ADMIN).json()["token"]
    other = token[:-1] + ("1" if token.endswith("0") else "0")
    url = dashboard.url + "/api/dead-letters/purge"
    body = {"all": True, "queue": queues.name(workload.depends)}
    forged: list[dict[str, Any]] = [
        # An HTML form posted from another site: the browser sends the cached credentials.
        {"data": {"all": "true"}, "headers": {"Origin": "https://evil.example"}},
        {"json": body, "headers": {"Origin": "https://evil.example", "X-CSRF-Token": token}},
        {"json": body, "headers": {"Referer": "https://evil.example/page", "X-CSRF-Token": token}},
        {"json": body, "headers": {"Origin": "null", "X-CSRF-Token": token}},
        {"json": body, "headers": {"Sec-Fetch-Site": "cross-site", "X-CSRF-Token": token}},
        {"json": body, "headers": {"Origin": dashboard.url}},  # no token
        {"data": "{}", "headers": {"Origin": dashboard.url, "X-CSRF-Token": token}},  # not JSON
        {"json": body, "headers": {"Origin": dashboard.url, "X-CSRF-Token": other}},
    ]
    import requests

    for attempt in forged:
        response = requests.post(url, auth=ADMIN, timeout=30, **attempt)
        assert response.status_code == 403, attempt
    assert dashboard.get("/api/audit", ADMIN).json()["entries"] == []  # nothing was even started
    accepted = dashboard.post("/api/dead-letters/purge", ADMIN, body, token=token)
    assert accepted.status_code == 200 and accepted.json() == {
        "purged": 0,
        "matched": 0,
        "unconfirmed": 0,
        "left": 0,
        "stopped": None,
        "notes": [],
    }
    # Behind a TLS proxy that keeps the Host header: the browser's origin is https.
    host = dashboard.url.split("://", 1)[1]
    proxied = {"Origin": f"https://{host}", "X-CSRF-Token": token}
    through_tls = requests.post(url, auth=ADMIN, timeout=30, json=body, headers=proxied)
    assert through_tls.status_code == 200, through_tls.text


def test_the_passwords_never_reach_the_logs(start_dashboard):
    dashboard = start_dashboard(LOG_LEVEL="DEBUG")
    for auth in [ADMIN, VIEWER, (DASHBOARD_ADMIN, DASHBOARD_VIEWER), ("admin", DASHBOARD_VIEWER)]:
        for path in ["/", "/api/jobs?q=" + DASHBOARD_ADMIN, "/jobs/" + DASHBOARD_VIEWER]:
            dashboard.get(path, auth)
    dashboard.post("/api/dead-letters/retry", ADMIN, {"queue": DASHBOARD_ADMIN, "ids": [DASHBOARD_VIEWER]})
    dashboard.stop()
    output = dashboard.output()
    assert "dashboard_login_refused" in output and "dashboard_request" in output  # it did log
    assert DASHBOARD_ADMIN not in output and DASHBOARD_VIEWER not in output


def test_dead_letters_are_listed_from_the_index_retried_purged_and_audited(
    start_worker, start_dashboard, queues, store, prefix
):
    store.set(f"test:{prefix}dependency-down", "1")
    worker = start_worker()
    dashboard = start_dashboard()
    queue = queues.name(workload.depends)
    sent = [queues.send(workload.depends, f"d{i}") for i in range(6)]
    assert {r.state for r in queues.wait_finished(sent).values()} == {"dead"}

    listed = wait_for(
        lambda: (
            (d := dashboard.get(f"/api/dead-letters?queue={queue}", ADMIN).json())["dead_letters"]
            and len(d["dead_letters"]) == 6
            and d
        ),
        what="six dead letters indexed",
    )
    assert {d["message_id"] for d in listed["dead_letters"]} == {m.message_id for m in sent}
    assert {d["exception"] for d in listed["dead_letters"]} == {"ConnectionError"}
    assert listed["facets"]["actor"] == ["depends"]
    page = dashboard.get(f"/api/dead-letters?queue={queue}&limit=4", ADMIN).json()
    rest = dashboard.get(f"/api/dead-letters?queue={queue}&before={page['next']}", ADMIN).json()
    assert len(page["dead_letters"]) == 4 and len(rest["dead_letters"]) == 2 and rest["next"] is None

    store.delete(f"test:{prefix}dependency-down")
    chosen = [sent[0].message_id, sent[1].message_id]
    retried = dashboard.post("/api/dead-letters/retry", ADMIN, {"queue": queue, "ids": chosen})
    assert retried.status_code == 200 and retried.json()["retried"] == 2
    wait_for(
        lambda: all(queues.status(m).state == "succeeded" for m in chosen), what="the replays to succeed"
    )
    purged = dashboard.post(
        "/api/dead-letters/purge", ADMIN, {"queue": queue, "all": True, "actor": "depends"}
    )
    assert purged.json() == {
        "purged": 4,
        "matched": 4,
        "unconfirmed": 0,
        "left": 0,
        "stopped": None,
        "notes": [],
    }
    assert queues.depth(queue + ".DLQ") == 0
    assert dashboard.get(f"/api/dead-letters?queue={queue}", ADMIN).json()["dead_letters"] == []
    assert store.hgetall(f"test:{prefix}effects") == {"d0": "1", "d1": "1"}

    audit = dashboard.get("/api/audit", ADMIN).json()["entries"]
    assert [(e["action"], e["user"], e["state"], e["count"]) for e in audit] == [
        ("dead_letters.purge", "admin", "done", 4),
        ("dead_letters.retry", "admin", "done", 2),
    ]
    assert audit[0]["filter"] == {
        "queue": queue,
        "all": True,
        "actor": "depends",
        "exception": None,
        "since": None,
    }
    assert audit[1]["filter"]["ids"] == chosen
    assert queues.left_after_stop([worker], queue) == 0


def test_a_queue_out_of_step_with_its_index_is_shown_and_reindexed(start_dashboard, queues):
    dashboard = start_dashboard()
    queue = queues.name(workload.depends)
    queues.broker.declare_queue(queue, ensure=True)
    wait_for(lambda: any(q["queue"] == queue for q in dashboard.get("/api/queues", ADMIN).json()["queues"]))
    headers = {"x-dl-reason": "retries_exhausted", "x-dl-exception": "KeyError", "x-dl-queue": queue}
    for i in range(3):  # dead letters the index never saw (as migrate-queues moves them)
        properties = pika.BasicProperties(delivery_mode=2, message_id=f"old-{i}", headers=headers)
        queues.broker.channel.basic_publish("", queue + ".DLQ", b"{}", properties)

    def out_of_step():
        counts = dashboard.get("/api/dead-letters", ADMIN).json()["queues"]
        return [c for c in counts if c["queue"] == queue and c["in_rabbitmq"] == 3 and not c["in_step"]]

    wait_for(out_of_step, what="the page to see the index out of step")
    reindexed = dashboard.post("/api/dead-letters/reindex", ADMIN, {"queue": queue}).json()
    assert reindexed == {"indexed": 3, "left_out": 0}
    listed = dashboard.get(f"/api/dead-letters?queue={queue}", ADMIN).json()
    assert sorted(d["message_id"] for d in listed["dead_letters"]) == ["old-0", "old-1", "old-2"]
    assert [c["in_step"] for c in listed["queues"] if c["queue"] == queue] == [True]
    assert queues.depth(queue + ".DLQ") == 3  # a re-index reads, never removes


def test_jobs_are_filtered_paged_and_found_by_id_or_idempotency_key(start_worker, start_dashboard, queues):
    start_worker()
    dashboard = start_dashboard()
    records = [queues.send(workload.record, f"r{i}") for i in range(5)]
    keyed = queues.send(workload.effect, "key-of-the-effect")
    failing = queues.send(workload.permanent, "p")
    queues.wait_finished([*records, keyed, failing])
    queue = queues.name(workload.record)

    everything = dashboard.get(f"/api/jobs?queue={queue}", ADMIN).json()
    assert everything["total"] == 7 and everything["exact"]
    times = [j["enqueued_at"] for j in everything["jobs"]]
    assert times == sorted(times, reverse=True)  # newest sent first (ties in one ms: by id)
    assert {j["message_id"] for j in everything["jobs"]} == {m.message_id for m in [*records, keyed, failing]}
    first = dashboard.get(f"/api/jobs?queue={queue}&actor=record&limit=3", ADMIN).json()
    second = dashboard.get(
        f"/api/jobs?queue={queue}&actor=record&limit=3&before={first['next']}", ADMIN
    ).json()
    ids = [j["message_id"] for j in first["jobs"] + second["jobs"]]
    assert sorted(ids) == sorted(m.message_id for m in records) and second["next"] is None
    dead = dashboard.get(f"/api/jobs?queue={queue}&state=dead", ADMIN).json()["jobs"]
    assert [j["message_id"] for j in dead] == [failing.message_id]

    by_id = dashboard.get(f"/api/jobs?q={records[2].message_id}", ADMIN).json()["jobs"]
    assert [j["message_id"] for j in by_id] == [records[2].message_id]
    by_key = dashboard.get("/api/jobs?q=key-of-the-effect", ADMIN).json()["jobs"]
    assert [j["message_id"] for j in by_key] == [keyed.message_id]

    answer = dashboard.get(f"/api/jobs/{failing.message_id}", ADMIN)
    job = answer.json()
    assert answer.status_code == 200  # its own error is not the page's
    assert [step[0] for step in job["timeline"]] == ["queued", "running", "failed", "dead"]
    assert job["error_type"] == "Permanent" and "this cannot succeed" in job["traceback"]
    assert "this cannot succeed" in job["job_error"]
    page = dashboard.get(f"/jobs/{failing.message_id}", ADMIN)
    assert page.status_code == 200 and "Retry now" in page.text
    assert job["dead_letter"]["reason"] == "non_retryable" and job["can_retry"]
    assert "args" not in job and job["args_shown"] is False  # the actor did not opt in


@pytest.mark.parametrize("what", ["workers", "schedules", "rate-limits"])
def test_workers_schedules_and_rate_limits(start_worker, start_dashboard, queues, what):
    worker = start_worker() if what == "workers" else None
    dashboard = start_dashboard()
    data = dashboard.get(f"/api/{what}", ADMIN).json()
    if what == "rate-limits":
        assert [b["service"] for b in data["buckets"]] == ["smtp"]
        assert data["buckets"][0]["tokens"] == data["buckets"][0]["burst"] == 1000
    elif what == "schedules":
        assert {s["id"] for s in data["schedules"]} >= {"queue-health-check"}
        assert all(s["next_fire"] for s in data["schedules"] if s["enabled"])
    else:
        live = wait_for(lambda: dashboard.get("/api/workers", ADMIN).json()["live"] == 1, what="a heartbeat")
        assert live
        (record,) = dashboard.get("/api/workers", ADMIN).json()["workers"]
        assert record["pid"] != os.getpid() and queues.name(workload.record) in record["queues"]
        assert record["threads"] == 4 and record["state"] == "live"
        assert worker is not None and worker.stop() == 0
        (stopped,) = dashboard.get("/api/workers", ADMIN).json()["workers"]
        assert stopped["state"] == "stopped"


def test_a_job_action_while_the_store_is_down_answers_503_not_500(start_dashboard):
    """Retrying or cancelling a job reads its record first: a store that does not answer then is
    a 503 with a JSON error, as for every other page, not an unhandled 500."""
    from tests.integration.test_store_faults import PrivateRedis

    store = PrivateRedis()
    try:
        dashboard = start_dashboard(STATE_URL=store.url)
        token = dashboard.get("/api/csrf", ADMIN).json()["token"]
        store.stop()
        for action in ("retry", "cancel"):
            answer = dashboard.post(f"/api/jobs/some-job/{action}", ADMIN, {}, token=token)
            assert answer.status_code == 503 and "unreachable" in answer.json()["error"], answer.text
    finally:
        store.stop()
