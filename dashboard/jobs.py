"""Jobs: the newest first, filtered and searched, from the job index; one job with its history.

The list is served from the job index in the state store (:mod:`jobsystem.store.job_index`): a page
reads its 50 ids and their records, whatever the number of records. A search (``q``) is exact: a
message id, else an idempotency key, looked up for each actor (keys are scoped by actor and
stored hashed, so they can only be found by asking for them whole).

A job's arguments are shown only when its actor opted in (``dashboard_args=True``): they are the
job's own data and may carry personal data no scrubber recognises. Its result, kept as the actor
returned it, is shown scrubbed as ``jobctl status`` shows it (its other texts were scrubbed when
written).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dashboard.dead_letters import shown_entry
from dashboard.project import STATE_RANKS, Cursor, JobFilter, JobStatus, Project, dead_letter_queue
from jobsystem.ops.status import shown_status

__all__ = ["STATES", "job_detail", "job_list", "job_row"]

#: States of a job that a cancellation can still stop (skipped on arrival, a scheduled one too, or
#: interrupted).
CANCELLABLE = ("queued", "scheduled", "running", "failed", "retrying")
#: The states, in the order the filter menu lists them.
STATES = sorted(STATE_RANKS, key=lambda s: (STATE_RANKS[s], s))
#: Rows per page, and the most a client may ask for.
PAGE, MAX_PAGE = 50, 200


def job_row(record: JobStatus) -> dict[str, Any]:
    """What the list shows of a job."""
    return {
        "message_id": record.message_id,
        "state": record.state,
        "actor": record.actor,
        "queue": record.queue,
        "attempts": record.attempts,
        "enqueued_at": record.enqueued_at,
        "updated_at": record.updated_at,
        "progress": record.progress,
        "error_type": record.error_type,
    }


def _search(project: Project, text: str, actor: str | None) -> list[JobStatus]:
    """The job whose message id is ``text``, else those whose idempotency key it is."""
    record = project.status.get(text)
    if record is not None:
        return [record]
    idempotency = project.idempotency
    if idempotency is None:
        return []
    found: dict[str, JobStatus] = {}
    for name in [actor] if actor else sorted(project.broker.actors):
        key = idempotency.lookup(name, text)
        if key is not None and key.message_id:
            job = project.status.get(key.message_id)
            if job is not None:
                found[job.message_id] = job
    return list(found.values())


def job_list(
    project: Project,
    *,
    queue: str | None = None,
    actor: str | None = None,
    state: str | None = None,
    q: str | None = None,
    before: str | None = None,
    limit: int = PAGE,
) -> dict[str, Any]:
    """The jobs page's data (``/jobs`` and ``/api/jobs``)."""
    limit = max(1, min(limit, MAX_PAGE))
    filters = {"queue": queue, "actor": actor, "state": state, "q": q}
    if q:
        records = _search(project, q.strip(), actor)
        jobs = [r for r in records if (not queue or r.queue == queue) and (not state or r.state == state)]
        return {
            "jobs": [job_row(r) for r in jobs],
            "next": None,
            "total": len(jobs),
            "exact": True,
            **filters,
        }
    job_filter = JobFilter(queue=queue, actor=actor, state=state)
    records, following = project.status.page(job_filter, Cursor.decode(before), limit)
    total, exact = project.status.total(job_filter)
    return {
        "jobs": [job_row(r) for r in records],
        "next": following.encode() if following else None,
        "total": total,
        "exact": exact,
        **filters,
    }


def job_detail(project: Project, message_id: str, queue: str | None = None) -> dict[str, Any] | None:
    """One job (``/jobs/{id}`` and ``/api/jobs/{id}``): its record with timeline, its dead letter
    when it has one (looked up in the record's queue, or ``queue`` once the record expired), and
    what an admin may do with it. None when neither is known."""
    record = project.status.get(message_id)
    index = project.dead_letter_index
    where = record.queue if record is not None and record.queue else queue
    dead = index.get(where, message_id) if index is not None and where else None
    if record is None and dead is None:
        return None
    # The result as jobctl status shows it: scrubbed (the viewer sees this page too).
    shown = shown_status(record, project.system.scrubber) if record else None
    # A dead letter whose record expired: the record's fields unknown (the page reads each one).
    unknown: dict[str, Any] = {**dict.fromkeys(f.name for f in dataclasses.fields(JobStatus)), "timeline": []}
    data: dict[str, Any] = (
        shown.to_dict() if shown else {**unknown, "message_id": message_id, "state": "dead"}
    )
    # The job's own error, renamed: a page's top-level "error" says the page itself failed.
    data["job_error"] = data.pop("error", None)
    data["args_shown"] = record is not None and record.args is not None
    if not data["args_shown"]:
        data.pop("args", None)
    data["dead_letter"] = shown_entry(dead) if dead else None
    data["dead_letter_queue"] = dead_letter_queue(dead.queue) if dead else None
    data["can_retry"] = dead is not None and dead.reason not in ("malformed", "undecodable")
    data["can_cancel"] = dead is None and data.get("state") in CANCELLABLE
    return data
