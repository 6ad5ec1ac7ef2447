"""The overview: every queue's numbers and verdict, as ``jobctl health`` has them, and charts.

The numbers come from the very function behind ``jobctl health`` (:func:`jobsystem.ops.health.check`):
AMQP passive declares, the management API, a peek at each queue's head, the status counters.
That costs a few hundred milliseconds at fifty queues, so it is not done per request: a
:class:`HealthSampler` thread measures every ``interval`` seconds and pages read its latest
report (its age is shown). However many browsers are open, RabbitMQ is asked once per interval.

Charts: jobs that succeeded and failed for good per minute over the last hour, per queue, from
the per-minute counts the status writer keeps in the state store.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from dashboard.project import HealthReport, Project, StoreUnavailable, check, project_queues, store_outage

__all__ = ["HealthSampler", "chart_points", "overview", "work_queues"]

logger = logging.getLogger("dashboard")


def work_queues(project: Project) -> list[str]:
    """The project's work queues (:func:`~jobsystem.ops.scope.project_queues`: its actors', with
    the modules given to ``jobctl dashboard``, and those its dead-letter index knows), never every
    queue with ``QUEUE_PREFIX``: the default, empty, prefix would show every application's."""
    return sorted(project_queues(project.broker))


class HealthSampler:
    """Measures the queues in the background; :meth:`latest` is what pages show.

    Parameters:
      project: the project.
      interval: seconds between two measurements (more when one takes longer than this).
    """

    def __init__(self, project: Project, interval: float = 2.0) -> None:
        self.project = project
        self.interval = interval
        self._report: HealthReport | None = None
        self._at = 0.0
        self._took = 0.0
        self._logged: dict[str, str] = {}
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, wait: float = 10.0) -> None:
        """Start measuring; wait up to ``wait`` seconds for the first report."""
        self._thread = threading.Thread(target=self._run, name="health-sampler", daemon=True)
        self._thread.start()
        self._ready.wait(wait)

    def stop(self) -> None:
        self._stop.set()

    def sample(self) -> HealthReport:
        """Measure now (also what the thread does)."""
        started = time.monotonic()
        report = check(work_queues(self.project), config=self.project.settings, state=self.project.store)
        self._report, self._at, self._took = report, time.time(), time.monotonic() - started
        # What did not answer, once per change (not every 2 s): its name at WARNING (a Sentry
        # breadcrumb), the errors' own words (hosts, ports) at DEBUG only, never on the pages.
        if report.causes and report.causes != self._logged:
            logger.warning("dashboard_health_unreachable", extra={"services": sorted(report.causes)})
            logger.debug("dashboard_health_unreachable_causes", extra={"errors": report.causes})
        self._logged = report.causes
        self._ready.set()
        return report

    def latest(self) -> tuple[HealthReport | None, float, float]:
        """The last report, when it was made (epoch s) and how long it took (s)."""
        return self._report, self._at, self._took

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception:  # the next interval tries again; the page shows the report's age
                logger.exception("dashboard_health_sample_failed")
            self._stop.wait(max(self.interval, self._took * 2))


def chart_points(
    per_minute: dict[int, dict[str, int]], now_ms: int, minutes: int = 60
) -> dict[str, list[int]]:
    """Succeeded and dead per minute over the last ``minutes`` minutes, oldest first."""
    first = (now_ms // 60_000 - minutes + 1) * 60_000
    slots = [first + i * 60_000 for i in range(minutes)]
    return {
        state: [per_minute.get(slot, {}).get(state, 0) for slot in slots] for state in ("succeeded", "dead")
    }


def overview(project: Project, sampler: HealthSampler) -> dict[str, Any]:
    """The overview's data (``/`` and ``/api/queues``)."""
    report, at, took = sampler.latest()
    if report is None:
        return {"status": "unknown", "queues": [], "notes": ["measuring the queues..."], "sampled_at": None}
    data = report.to_dict()  # what did not answer said without hosts and ports (its causes: logged)
    data["notes"][:0] = [p["detail"] for p in data["problems"]]  # the system's own (the store down)
    now_ms = int(time.time() * 1000)
    names = [q["queue"] for q in data["queues"]]
    try:
        minutes = project.status.minutes(names, now_ms - 3_600_000)
    except StoreUnavailable as exc:
        minutes = {}
        data["notes"].append(store_outage(exc, "no charts"))
    for queue in data["queues"]:
        queue["problems"] = [p["detail"] for p in queue["problems"]]
        queue["per_minute"] = chart_points(minutes.get(queue["queue"], {}), now_ms)
    data["sampled_at"] = int(at * 1000)
    data["sample_took_ms"] = int(took * 1000)
    return data
