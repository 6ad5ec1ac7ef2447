"""Schedules, rate limits, workers and the audit log, as the dashboard shows them.

- Schedules: the schedules file the scheduler reads, each entry's next fire (its trigger) and
  last fire sent (the scheduler's record in the state store), and the current leader's lease.
- Rate limits: each bucket of ``RATE_LIMITS`` read without taking a token (rate, burst, tokens
  now, tokens reserved by waiting jobs, jobs deferred to a slot on record, drained until).
  Per-key buckets (``service:key``) are created by jobs and named by hashes; they are not listed.
- Workers: the heartbeats worker processes write; a worker whose last beat is older than three
  intervals is shown ``gone``, one that stopped cleanly ``stopped``.
- Audit: the operators' actions, newest first.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from dashboard.project import (
    LEADER_LEASE,
    Cursor,
    Project,
    ScheduleError,
    last_fire_key,
    queue_of,
)

__all__ = ["audit_list", "rate_limits", "schedules", "workers"]

#: A worker silent this long (three beats missed) is gone.
GONE_AFTER_MS = 15_000


def schedules(project: Project) -> dict[str, Any]:
    """Each schedule with its next and last fire, and the leader (``/api/schedules``)."""
    path = str(project.schedules_file)
    try:
        entries = project.load_schedules()
    except ScheduleError as exc:
        return {"file": path, "schedules": [], "leader": None, "problems": exc.problems}
    now = datetime.now(UTC)
    rows = []
    for schedule in entries:
        raw = project.store.get(last_fire_key(schedule.id))
        following = schedule.trigger.get_next_fire_time(None, now) if schedule.enabled else None
        rows.append(
            {
                "id": schedule.id,
                "actor": schedule.actor,
                "queue": queue_of(schedule, project.broker, project.settings),
                "spec": schedule.spec,
                "enabled": schedule.enabled,
                "next_fire": following.astimezone(UTC).isoformat() if following else None,
                "last_fire": raw.decode() if raw else None,
            }
        )
    return {
        "file": path,
        "schedules": rows,
        "leader": project.store.lease_holder(LEADER_LEASE),
        "problems": [],
    }


def rate_limits(project: Project) -> dict[str, Any]:
    """Each configured bucket as it stands (``/api/rate-limits``)."""
    rows = []
    for service, limit in sorted(project.settings.rate_limits.items()):
        level = project.buckets.peek(service, limit.rate, limit.burst)
        now_ms = time.time() * 1000
        rows.append(
            {
                "service": service,
                "rate_per_s": limit.rate,
                "burst": limit.burst,
                "tokens": round(max(level.tokens, 0.0), 2),
                "reserved": round(level.reserved, 2),
                "deferred": level.deferred,
                "drained_until": int(level.blocked_until_ms) if level.blocked_until_ms > now_ms else None,
            }
        )
    return {"buckets": rows}


def workers(project: Project) -> dict[str, Any]:
    """Worker processes from their heartbeats, live ones first (``/api/workers``)."""
    now_ms = int(time.time() * 1000)
    rows = []
    for record in project.heartbeats.workers(now_ms):
        if record.get("stopped_at"):
            state = "stopped"
        elif now_ms - int(record["last_beat"]) > GONE_AFTER_MS:
            state = "gone"
        else:
            state = "live"
        rows.append({**record, "state": state})
    rows.sort(key=lambda r: (r["state"] != "live", r["host"], r["pid"]))
    live = [r for r in rows if r["state"] == "live"]
    return {
        "workers": rows,
        "live": len(live),
        "threads": sum(int(r.get("threads", 0)) for r in live),
        "busy": sum(int(r.get("busy", 0)) for r in live),
    }


def audit_list(project: Project, before: str | None = None, limit: int = 50) -> dict[str, Any]:
    """The audit log, newest first (``/api/audit``)."""
    entries, following = project.audit.page(Cursor.decode(before), max(1, min(limit, 200)))
    return {"entries": entries, "next": following.encode() if following else None}
