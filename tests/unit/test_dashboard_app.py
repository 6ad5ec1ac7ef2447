"""The dashboard's ASGI app in process, on the real store backends, RabbitMQ stood in for: pages
that render whatever the audit log holds, actions that answer an outage with 503, links that
stay on the job they name. (No httpx here, so no Starlette TestClient: ``tests.asgi`` calls it.)"""

from __future__ import annotations

import json
import time
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote, urljoin

import pika
import pytest

from dashboard import dead_letters as dashboard_dead_letters
from dashboard.dead_letters import RABBITMQ_TIMEOUT_S, Selection, rabbitmq_counts
from dashboard.guard import SECURITY_HEADERS
from jobsystem.ops import dead_letters as dead_letter_ops
from jobsystem.ops.health import HealthReport, Problem
from jobsystem.privacy.scrub import Scrubber
from jobsystem.settings import Settings
from jobsystem.store import StateStore, open_store
from jobsystem.store.audit import audit_backend
from jobsystem.store.base import StoreUnavailable
from jobsystem.store.buckets import bucket_backend
from jobsystem.store.dead_letter_index import DeadLetterEntry, dead_letter_index
from jobsystem.store.heartbeats import heartbeat_backend
from jobsystem.store.status import status_backend
from jobsystem.store.status_records import StatusUpdate, order_of
from tests.amqp_server import fake_rabbitmq
from tests.asgi import ADMIN, VIEWER, app_of, call
from tests.servers import free_port
from tests.support import finished_within
from tests.unit.dead_letter_standins import letters_of, reader_lost_at_read
from tests.unit.test_dlq_replay import _Queues

#: RabbitMQ on a port nobody listens on: every connection is refused at once.
DOWN = Settings(
    rabbitmq_url="amqp://guest:guest@127.0.0.1:1/%2F",
    rabbitmq_management_url="http://127.0.0.1:1",
    queue_prefix="t_",
)


def dashboard(
    store: StateStore, settings: Settings = DOWN, report: HealthReport | None = None
) -> tuple[Any, SimpleNamespace, dict[str, str]]:
    """The app over ``store``, RabbitMQ as ``settings`` say, the queues' health as ``report`` says,
    and the headers an admin's POST carries."""
    broker = SimpleNamespace(
        actors={"a1": SimpleNamespace(queue_name=settings.queue("emails"))},  # the reference actors' queue
        dead_letter_index=SimpleNamespace(backend=dead_letter_index(store)),
        middleware=[],
        parameters=pika.URLParameters(settings.rabbitmq_url),
        environment=settings.queue_prefix,
    )
    project = SimpleNamespace(
        store=store,
        settings=settings,
        broker=broker,
        system=SimpleNamespace(broker=broker, scrubber=Scrubber()),
        status=status_backend(store),
        audit=audit_backend(store),
        heartbeats=heartbeat_backend(store),
        buckets=bucket_backend(store),
        dead_letter_index=dead_letter_index(store),
        idempotency=None,
    )
    app, post = app_of(project, report)
    return app, project, post


def test_the_audit_page_shows_actions_that_have_no_count_yet_or_never_will(store):
    """An action is "started" while it runs, "refused" or "failed" when it did not run: none has a
    count. The page rendered the missing count as a number: 500 for as long as one was listed."""
    app, project, _ = dashboard(store)
    now = int(time.time() * 1000)
    project.audit.start({"user": "admin", "action": "dead_letters.retry", "filter": {"queue": "q"}}, now)
    refused = project.audit.start({"user": "admin", "action": "dead_letters.purge", "filter": {}}, now + 1)
    project.audit.finish(refused, {"state": "refused", "error": "RabbitMQ has no dead-letter queue"})
    done = project.audit.start({"user": "admin", "action": "dead_letters.reindex", "filter": {}}, now + 2)
    project.audit.finish(done, {"state": "done", "count": 1234, "outcome": {"indexed": 1234}})
    page = call(app, "GET", "/audit")
    assert page.status_code == 200, page.text
    assert "refused" in page.text and "started" in page.text and "1,234" in page.text


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/dead-letters/retry", {"queue": "emails", "ids": ["m1"]}),
        ("/api/dead-letters/purge", {"queue": "emails", "all": True}),
        ("/api/dead-letters/reindex", {"queue": "emails"}),
    ],
)
def test_an_action_while_rabbitmq_is_down_answers_503_and_is_audited_failed(store, path, body):
    """RabbitMQ refusing connections is an outage, as the store's is: 503 with a JSON error, not a
    500 "failed" that reads as a bug in the dashboard."""
    app, _, post = dashboard(store)
    answer = call(app, "POST", path, body, post)
    assert answer.status_code == 503, answer.text
    assert "RabbitMQ unreachable" in answer.json()["error"]
    (entry,) = call(app, "GET", "/api/audit").json()["entries"]
    assert entry["state"] == "failed"


def test_a_job_link_and_its_actions_stay_on_the_job_whatever_its_message_id(store):
    """A message id is anyone's text (whoever published the message chose it): with a ``/`` left
    as is, ``a/../../victim`` made the pages' links and the Retry button point at another job."""
    app, project, _ = dashboard(store)
    now = int(time.time() * 1000)
    crafted = "x/../../victim"
    once = {"actor": "a1", "queue": "t_q", "enqueued_at": str(now)}
    update = StatusUpdate(
        crafted, "t_q", order_of(0, "queued"), {"state": "queued", "updated_at": str(now)}, once
    )
    project.status.apply([update], 60_000)
    entry = DeadLetterEntry("t_q", crafted, "a1", "retries_exhausted", "E", "err", "tb", 3, now, now)
    project.dead_letter_index.add([entry], ttl_ms=None, max_length=None)

    def targets(page: str, attribute: str) -> list[str]:
        """Where the page's ``attribute`` URLs that name a job lead, as a browser resolves them."""
        found = [f.split('"')[0] for f in page.split(f'{attribute}="')[1:]]
        return [
            urljoin("http://testserver/jobs/here", f) for f in found if f.startswith(("/jobs/", "/api/jobs/"))
        ]

    job_page = call(app, "GET", "/jobs/" + quote(crafted, safe=""))
    assert job_page.status_code == 200, job_page.text
    (retry,) = [u for u in targets(job_page.text, "data-url") if u.endswith("/retry")]
    links = targets(call(app, "GET", "/jobs").text, "href")
    links += targets(call(app, "GET", "/dead-letters").text, "href")
    assert len(links) == 2
    for url in [retry, *links]:
        assert "/x%2F..%2F..%2Fvictim" in url, url


class _Down:
    """A store feature whose every call finds the store down."""

    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any, **kwargs: Any) -> Any:
            raise StoreUnavailable("redis: ConnectionError: Connection refused")

        return fail


@pytest.mark.parametrize("path", ["/jobs", "/jobs/m1", "/dead-letters", "/workers", "/audit"])
def test_a_page_while_the_store_is_down_answers_503_with_the_page_not_500(store, path):
    """The jobs page's template read the filter menus from data a failed page does not have:
    a 500 with no page at all (its JSON twin said 503) until the store came back."""
    app, project, _ = dashboard(store)
    project.status = project.audit = project.heartbeats = project.dead_letter_index = _Down()
    page = call(app, "GET", path)
    assert page.status_code == 503, page.text
    assert "state store unreachable" in page.text and "<nav>" in page.text


def test_the_dead_letters_page_lists_what_its_purge_all_matching_button_would_purge(store):
    """Actions name a queue as ``emails`` (the README's example; the environment's prefix added),
    the listing took it as written: ``?queue=emails`` showed "no dead letters match" while its
    "Purge all matching" button, sent with the same filter, purged every one of ``t_emails``."""
    app, project, _ = dashboard(store)
    now = int(time.time() * 1000)
    entry = DeadLetterEntry("t_emails", "m1", "a1", "retries_exhausted", "E", "err", "tb", 3, now, now)
    project.dead_letter_index.add([entry], ttl_ms=None, max_length=None)
    listed = call(app, "GET", "/api/dead-letters?queue=emails").json()
    assert [d["message_id"] for d in listed["dead_letters"]] == ["m1"] and listed["queue"] == "t_emails"
    page = call(app, "GET", "/dead-letters?queue=emails").text
    sent = page.split("data-filter='")[1].split("'")[0]  # what "all matching" sends
    assert json.loads(sent)["queue"] == "t_emails"


def test_the_dead_letter_counts_give_up_on_a_rabbitmq_that_never_answers(store):
    # It accepts the connection and the handshake, then never answers a declare: without a deadline
    # every refresh of the page (every 3 s) held a request thread until pika's heartbeat gave up.
    with fake_rabbitmq(declare=False) as rabbit:
        settings = Settings(
            rabbitmq_url=f"amqp://guest:guest@127.0.0.1:{rabbit.port}/%2F?heartbeat=0",
            rabbitmq_management_url="http://127.0.0.1:1",
            queue_prefix="t_",
        )
        _, project, _ = dashboard(store, settings)
        started = time.monotonic()
        counts = finished_within(
            RABBITMQ_TIMEOUT_S + 3,
            lambda: rabbitmq_counts(project, ["t_emails"]),  # type: ignore[arg-type]  # a stand-in
        )
        assert counts == {"t_emails": None} and time.monotonic() - started < RABBITMQ_TIMEOUT_S + 1
    with fake_rabbitmq(declare=True) as rabbit:  # one that answers: every queue there, empty
        answering = Settings(
            rabbitmq_url=f"amqp://guest:guest@127.0.0.1:{rabbit.port}/%2F", queue_prefix="t_"
        )
        _, project, _ = dashboard(store, answering)
        counts = finished_within(10, lambda: rabbitmq_counts(project, ["t_emails"]))  # type: ignore[arg-type]
        assert counts == {"t_emails": 0}


def test_the_exception_filter_none_selects_the_dead_letters_without_an_exception(store):
    """A dead letter without an exception (rejected, aged out) is listed as "(none)", and the
    filter offered it: choosing it sent an empty value (every dead letter listed), typing it
    filtered on the literal text (none listed), and "all matching" then acted on every one."""
    app, project, _ = dashboard(store)
    now = int(time.time() * 1000)
    failed = DeadLetterEntry("t_q", "m1", "a1", "retries_exhausted", "E", "err", "tb", 3, now, now)
    aged = DeadLetterEntry("t_q", "m2", "a1", "age_limit", "", "", "", 1, now, now + 1)
    project.dead_letter_index.add([failed, aged], ttl_ms=None, max_length=None)
    listed = call(app, "GET", "/api/dead-letters?exception=(none)").json()
    assert [d["message_id"] for d in listed["dead_letters"]] == ["m2"]
    assert listed["facets"]["exception"] == ["(none)", "E"]
    assert [d["message_id"] for d in call(app, "GET", "/api/dead-letters").json()["dead_letters"]] == [
        "m2",
        "m1",
    ]
    page = call(app, "GET", "/dead-letters?exception=%28none%29").text
    assert "<option selected>(none)</option>" in page and ">m1<" not in page
    sent = json.loads(page.split("data-filter='")[1].split("'")[0])  # what "all matching" sends
    matches = Selection.from_json({**sent, "all": True}).filters().match

    def read(exception: str) -> Any:  # a dead letter as the operations read it from RabbitMQ
        return SimpleNamespace(message_id="m", queue="t_q", actor="a1", exception=exception, failed_at=None)

    assert matches(read("")) and not matches(read("E"))


def test_an_outage_is_shown_without_the_address_or_the_text_of_the_error():
    """A store error's text names the store's host and port (its URL may hold a password too): the
    action's answer said "audit log unwritable, nothing done (redis: ConnectionError: Error 111
    connecting to 127.0.0.1:...)", and the overview showed the health check's texts as they were.
    The health check keeps them in its report's ``causes`` (for the log), which no page shows."""
    port = free_port()
    down = open_store(f"redis://:password-in-url@127.0.0.1:{port}/0", namespace="t-down:")
    try:
        down.ping()
    except StoreUnavailable as exc:
        store_error = str(exc)
    assert f"127.0.0.1:{port}" in store_error  # what must not be shown
    problem = Problem("state_store", "state store unreachable, no totals (StoreUnavailable)")
    degraded = HealthReport("degraded", [], "amqp", problems=[problem], causes={"state_store": store_error})
    causes = {"unreachable": "amqp://guest:***@10.9.8.7:5672/%2F AMQPError"}
    unreachable = HealthReport(
        "unreachable", [], error="RabbitMQ unreachable (ConnectionError)", causes=causes
    )
    app, _, post = dashboard(down, report=degraded)
    action = call(app, "POST", "/api/dead-letters/purge", {"all": True}, post)
    assert action.status_code == 503 and "audit log unwritable" in action.json()["error"]
    shown = [action.text]
    for report in (degraded, unreachable):
        app, _, _ = dashboard(down, report=report)
        shown += [call(app, "GET", "/").text, call(app, "GET", "/api/queues").text]
    for text in shown:
        assert str(port) not in text and "10.9.8.7" not in text and "password-in-url" not in text, text
    assert "state store unreachable" in shown[1] and "RabbitMQ unreachable" in shown[3]
    down.close()


def test_the_sampler_logs_why_a_service_did_not_answer_once_per_change(monkeypatch, caplog):
    """What pages no longer show (hosts, ports) the dashboard's log keeps: the report's causes."""
    import dashboard.queues

    causes = {"state_store": "redis: ConnectionError: Error 111 connecting to 10.1.2.3:6379."}
    reports = iter(
        [HealthReport("degraded", [], "amqp", causes=dict(causes)) for _ in range(2)]
        + [HealthReport("healthy", [], "amqp")]
    )
    monkeypatch.setattr(dashboard.queues, "check", lambda *_a, **_kw: next(reports))
    monkeypatch.setattr(dashboard.queues, "work_queues", lambda _project: [])
    sampler = dashboard.queues.HealthSampler(SimpleNamespace(settings=None, store=None))  # type: ignore[arg-type]
    with caplog.at_level("DEBUG", logger="dashboard"):
        for _ in range(3):
            sampler.sample()
    warned = [r for r in caplog.records if r.getMessage() == "dashboard_health_unreachable"]
    assert [(r.levelname, r.__dict__["services"]) for r in warned] == [("WARNING", ["state_store"])]
    logged = [r for r in caplog.records if r.getMessage() == "dashboard_health_unreachable_causes"]
    assert [(r.levelname, r.__dict__["errors"]) for r in logged] == [("DEBUG", causes)]


class _Broken:
    """A store feature whose every call fails as a bug would, naming an address in its text."""

    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("unexpected reply from 10.1.2.3:6379")

        return fail


def test_refusals_and_failures_carry_the_security_headers_and_are_not_cached(store):
    """The headers were added to what the routes answered only: a 401, a 403 and a 500 went out
    without them (no ``Cache-Control: no-store``, no framing or sniffing rules)."""
    app, project, post = dashboard(store)
    project.status = _Broken()
    purge = ("POST", "/api/dead-letters/purge", {"all": True})
    answers = {
        401: [call(app, "GET", "/audit", auth=None), call(app, "GET", "/", auth=(ADMIN[0], VIEWER[1]))],
        403: [
            call(app, *purge, post, auth=VIEWER),
            call(app, *purge, {**post, "Origin": "https://evil.example"}),
        ],
        500: [call(app, "GET", "/jobs/m1")],
    }
    for status, answered in answers.items():
        for answer in answered:
            assert answer.status_code == status, answer.text
            for name, value in SECURITY_HEADERS.items():
                assert answer.headers.get(name.lower()) == value, (status, name)
    assert all(a.headers["www-authenticate"].startswith("Basic ") for a in answers[401])
    assert "10.1.2.3" not in answers[500][0].text


@pytest.mark.parametrize(
    ("path", "count"), [("/api/dead-letters/retry", "retried"), ("/api/dead-letters/purge", "purged")]
)
def test_an_action_whose_connection_is_lost_midway_answers_what_it_did_and_is_audited_stopped(
    store, monkeypatch, path, count
):
    """The first queue's letters are done, then the reader's connection is lost: the answer was a
    503 "RabbitMQ unreachable ... nothing done, or only part of it", which tells the operator
    neither what was done nor what is left. It is the outcome, with the note saying why it
    stopped, and the audit log keeps it as stopped."""
    queues = _Queues({name: letters_of(name, 2, "t_") for name in ("t_emails.DLQ", "t_more.DLQ")})
    monkeypatch.setattr(
        dashboard_dead_letters, "_target", lambda project, s: (sorted(queues.letters), s.filters())
    )
    monkeypatch.setattr(dead_letter_ops, "Reader", reader_lost_at_read(queues, 2))
    monkeypatch.setattr(dead_letter_ops, "send_bulk", queues.send_bulk)
    app, _, post = dashboard(store)
    answer = call(app, "POST", path, {"all": True}, post)
    assert answer.status_code == 200, answer.text
    data = answer.json()
    assert (data[count], data["stopped"]) == (2, "StreamLostError")
    assert data["notes"][-1].startswith("stopped: reading the dead letters failed")
    (entry,) = call(app, "GET", "/api/audit").json()["entries"]
    assert (entry["state"], entry["count"]) == ("stopped", 2)


def test_a_reindex_whose_connection_is_lost_midway_answers_503_with_why_and_keeps_the_index(
    store, monkeypatch
):
    """The answer was "RabbitMQ unreachable ... nothing done, or only part of it": the re-index
    says it stopped reading, by the error's class, and that it re-indexed nothing; the index
    is as it was, and the audit log keeps the action as failed with that note."""
    letters = letters_of("t_emails.DLQ", 2, "t_")
    queues = _Queues({"t_emails.DLQ": letters})
    monkeypatch.setattr(dashboard_dead_letters, "_dead_letter_queues", lambda *a, **k: ["t_emails.DLQ"])
    monkeypatch.setattr(dashboard_dead_letters, "missing_queues", lambda settings, names: [])
    monkeypatch.setattr(dead_letter_ops, "Reader", reader_lost_at_read(queues, 1))
    app, project, post = dashboard(store)
    project.dead_letter_index.add([letters[0].index_entry()], ttl_ms=None, max_length=None)
    answer = call(app, "POST", "/api/dead-letters/reindex", {"queue": "emails"}, post)
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"] == (
        "stopped: reading the dead letters failed, RabbitMQ closed or lost the connection"
        " (StreamLostError): nothing re-indexed; re-index again"
    )
    (entry,) = call(app, "GET", "/api/audit").json()["entries"]
    assert (entry["state"], entry["error"]) == ("failed", "StreamLostError")
    assert project.dead_letter_index.counts() == {"t_emails": 1} and "10.0.0.5" not in answer.text


def test_a_purge_takes_the_replays_a_stopped_retry_answered():
    selection = Selection.from_json({"queue": "emails", "ids": ["m1"], "replays": 0})
    assert selection.filters().replays == 0 and selection.describe()["replays"] == 0
    for wrong in ("0", -1, True):
        with pytest.raises(dashboard_dead_letters.ActionError, match="replays must be a count"):
            Selection.from_json({"queue": "emails", "ids": ["m1"], "replays": wrong})
