"""The dashboard in a real headless Chromium (Debian's ``chromium``, driven by Playwright): log in,
watch a queue's numbers change as jobs run, find a job, follow its progress and timeline, select
dead letters and retry them, see the action audited; the viewer cannot act. A screenshot of every
page is saved in ``tests/artifacts/`` (git-ignored)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dramatiq
import pytest
import redis

from tests import workload
from tests.dashboard_server import DASHBOARD_ADMIN, DASHBOARD_VIEWER
from tests.queues import Queues
from tests.support import ROOT, wait_for

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = ROOT / "tests" / "artifacts"

playwright = pytest.importorskip("playwright.sync_api")


@pytest.fixture
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail("chromium is not installed (apt-get install chromium; .ci/run installs it)")
    with playwright.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield launched
        launched.close()


def session(browser: Browser, user: str, password: str) -> Page:
    context = browser.new_context(
        http_credentials={"username": user, "password": password}, viewport={"width": 1440, "height": 900}
    )
    context.set_default_timeout(30_000)
    return context.new_page()


def shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"dashboard-{name}.png"), full_page=True)


def cell(page: Page, queue: str, column: str) -> str:
    return page.locator(f'#queues tr[data-queue="{queue}"] td[data-col="{column}"]').inner_text()


def test_an_operator_watches_finds_follows_retries_and_audits(
    browser, start_worker, start_dashboard, queues, store, prefix
):
    worker = start_worker(threads=2)
    dashboard = start_dashboard()
    queue = queues.name(workload.record)
    queues.broker.declare_queue(queue, ensure=True)
    page = session(browser, "admin", DASHBOARD_ADMIN)
    watch_the_overview(page, dashboard.url, queues, queue)
    follow_a_job(page, dashboard.url, queues, queue, store, prefix)
    dead = retry_two_dead_letters(page, dashboard.url, queues, store, prefix)
    see_the_action_audited(page, dashboard.url)
    the_viewer_cannot_act(browser, dashboard.url, queue)
    assert queues.status(dead[2].message_id).state == "dead"
    assert queues.left_after_stop([worker], queue) == 0


def watch_the_overview(page: Page, url: str, queues: Queues, queue: str) -> None:
    """The queue's succeeded count goes up while the page is open (it updates itself)."""
    page.goto(url + "/")
    page.wait_for_selector(f'#queues tr[data-queue="{queue}"]')
    before = int(cell(page, queue, "succeeded").replace(",", "") or 0)
    sent = [queues.send(workload.record, f"r{i}") for i in range(20)]
    queues.wait_finished(sent)
    page.wait_for_function(
        "([q, n]) => { const c = document.querySelector("
        '`#queues tr[data-queue="${q}"] td[data-col=succeeded]`);'
        " return c && parseInt(c.innerText.replace(/,/g, '')) >= n; }",
        arg=[queue, before + 20],
    )
    shot(page, "overview")


def follow_a_job(page: Page, url: str, queues: Queues, queue: str, store: redis.Redis, prefix: str) -> None:
    """Find a job by id, open it, watch its progress and timeline move."""
    staged = queues.send(workload.staged, "s1", 2)
    wait_for(lambda: queues.status(staged.message_id), what="the staged job's record")
    page.goto(url + "/jobs")
    page.fill('input[name="q"]', staged.message_id)
    page.click('form.filters button[type="submit"]')
    page.click(f'#jobs a:text("{staged.message_id}")')
    page.wait_for_selector("#job-progress")
    page.wait_for_function("() => document.querySelectorAll('#timeline li').length >= 2")  # queued, running
    store.set(f"test:{prefix}go:s1:0", 1)
    page.wait_for_function("() => document.querySelector('#job-progress').value >= 0.5")
    shot(page, "job-running")
    store.set(f"test:{prefix}go:s1:1", 1)
    page.wait_for_selector('#timeline .badge:text("succeeded")')
    assert page.locator("#timeline li").first.inner_text().startswith("queued"), queues.status(
        staged.message_id
    )
    shot(page, "job")
    page.goto(url + f"/jobs?queue={queue}")
    shot(page, "jobs")


def retry_two_dead_letters(
    page: Page, url: str, queues: Queues, store: redis.Redis, prefix: str
) -> list[dramatiq.Message[Any]]:
    """Select two of three dead letters, retry them once the dependency is back: they run."""
    store.set(f"test:{prefix}dependency-down", "1")
    dead = [queues.send(workload.depends, f"d{i}") for i in range(3)]
    queues.wait_finished(dead)
    page.goto(url + "/dead-letters")
    page.wait_for_selector(f'input.pick[value="{dead[2].message_id}"]')
    shot(page, "dead-letters")
    store.delete(f"test:{prefix}dependency-down")
    page.on("dialog", lambda dialog: dialog.accept())
    for message in dead[:2]:
        page.check(f'input.pick[value="{message.message_id}"]')
    page.click('#dl-actions button.selection[data-op="retry"]')
    page.wait_for_selector('#toast .msg:text("retried 2")')
    wait_for(
        lambda: all(queues.status(m.message_id).state == "succeeded" for m in dead[:2]),
        what="the retried jobs to succeed",
    )
    page.wait_for_function(
        '(id) => !document.querySelector(`input.pick[value="${id}"]`)', arg=dead[0].message_id
    )
    return dead


def see_the_action_audited(page: Page, url: str) -> None:
    """The action is in the audit log, with who and how many; the other pages render."""
    page.goto(url + "/audit")
    row = page.locator("#audit tbody tr").first
    assert "dead_letters.retry" in row.inner_text() and "admin" in row.inner_text()
    assert row.locator("td.n").inner_text() == "2"
    shot(page, "audit")
    for name in ("schedules", "rate-limits", "workers"):
        page.goto(url + f"/{name}")
        page.wait_for_selector("table.grid")
        shot(page, name)
    assert page.locator("#workers tbody tr").count() >= 1


def the_viewer_cannot_act(browser: Browser, url: str, queue: str) -> None:
    """The viewer sees the same pages, without a way to act; a POST from its page is refused."""
    viewer = session(browser, "viewer", DASHBOARD_VIEWER)
    viewer.goto(url + "/dead-letters")
    viewer.wait_for_selector("#dead-letters")
    assert viewer.locator("#dl-actions").count() == 0 and viewer.locator("input.pick").count() == 0
    status = viewer.evaluate(
        """async (queue) => (await fetch('/api/dead-letters/retry', {method: 'POST',
            headers: {'Content-Type': 'application/json',
                      'X-CSRF-Token': document.querySelector('meta[name=csrf-token]').content},
            body: JSON.stringify({queue: queue, all: true})})).status""",
        queue,
    )
    assert status == 403


def test_an_admin_cancels_a_running_job_from_its_page(
    browser, start_worker, start_dashboard, queues, store, prefix
):
    """The job page of a running job has a cancel button: the job stops and says ``cancelled``."""
    start_worker()
    dashboard = start_dashboard()
    running = queues.send(workload.ticking, "ui", 30)
    wait_for(lambda: store.llen(f"test:{prefix}tick:ui") >= 3, what="the job ticking")
    wait_for(lambda: queues.status(running.message_id).state == "running", what="the running record")
    page = session(browser, "admin", DASHBOARD_ADMIN)
    page.on("dialog", lambda dialog: dialog.accept())
    page.goto(dashboard.url + f"/jobs/{running.message_id}")
    page.click("#cancel-job")
    page.wait_for_selector('#toast .msg:text("cancelled 1")')
    page.wait_for_selector('#timeline .badge:text("cancelled")')
    assert page.locator("#cancel-job").count() == 0  # a finished job has nothing left to cancel
    shot(page, "job-cancelled")
    record = queues.wait_finished([running])[running.message_id]
    assert record.state == "cancelled"
    ticks = store.llen(f"test:{prefix}tick:ui")
    page.goto(dashboard.url + "/audit")
    assert "job.cancel" in page.locator("#audit tbody tr").first.inner_text()
    assert store.llen(f"test:{prefix}tick:ui") == ticks
