"""Review 3, the dashboard: a fault found by reading, fixed since (the test failed before).

- A job's result was shown on its page and in ``/api/jobs/{id}`` as the actor returned it, to the
  read-only viewer too, while ``jobctl status`` scrubs the same result as a structure first ("a
  dict under ``address`` goes whole"): a result holding an address, an email or a name was shown
  in clear. Arguments, by contrast, are hidden unless the actor opts in, for that very reason.
"""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import quote

from jobsystem.privacy.scrub import Scrubber
from jobsystem.store import StateStore
from jobsystem.store.status_records import StatusUpdate, order_of
from tests.asgi import VIEWER, call
from tests.unit.test_dashboard_app import dashboard

#: What an application's actor may return: its own data, personal data included.
RESULT = {
    "customer": {"email": "ana.lopez@example.com", "name": "Ana Lopez"},
    "address": {"line1": "12 Rue Lepic"},
}


def project_over(store: StateStore) -> tuple[Any, Any]:
    """The app over a stand-in of :class:`dashboard.project.Project` on ``store``
    (``tests.unit.test_dashboard_app``), with the project's scrubber where the real one has it
    (``system.scrubber`` and ``scrub``)."""
    app, project, _ = dashboard(store)
    scrubber = Scrubber()
    project.system.scrubber, project.scrub = scrubber, scrubber.text
    return app, project


def succeeded(project: Any, message_id: str, result: Any) -> None:
    """Record ``message_id`` as a job of ``bill`` that succeeded with ``result``, as Status does."""
    now = str(int(time.time() * 1000))
    once = {"actor": "bill", "queue": "t_billing", "enqueued_at": now}
    fields = {"state": "succeeded", "updated_at": now, "finished_at": now, "result": json.dumps(result)}
    project.status.apply(
        [StatusUpdate(message_id, "t_billing", order_of(1, "succeeded"), fields, once)], 60_000
    )


def test_a_jobs_result_is_shown_scrubbed_as_jobctl_status_shows_it(store: StateStore) -> None:
    app, project = project_over(store)
    succeeded(project, "m-1", RESULT)
    # What jobctl status prints of the same record (jobctl.main.status): scrubbed as a structure.
    shown_by_jobctl = json.dumps(project.system.scrubber(RESULT))
    assert "ana.lopez" not in shown_by_jobctl and "Rue Lepic" not in shown_by_jobctl
    for path in (f"/api/jobs/{quote('m-1')}", f"/jobs/{quote('m-1')}"):
        answer = call(app, "GET", path, auth=VIEWER)
        assert answer.status_code == 200, answer.text
        for personal in ("ana.lopez", "Ana Lopez", "Rue Lepic"):
            assert personal not in answer.text, f"{path} shows {personal!r}"
