"""Reports: build a CSV from rows given or generated, store it, then enqueue the email that delivers it.

The pattern to copy: a job does its slow work, writes its output somewhere durable, and hands the
next step to another actor by message instead of doing everything in one long job. What the
message holds is checked first: a bad ``kind``, ``day`` or row fails at once (:class:`InvalidReport`,
in ``throws``), since a retry would meet the same data.
"""

from __future__ import annotations

import csv
import random
import re
import time
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import dramatiq
from dramatiq.middleware import CurrentMessage

from actors.emails import send_email
from actors.files import PARTIAL_SUFFIX, OutsideDirectory, inside, replacing
from jobsystem.observability.logs import get_logger
from jobsystem.system import get_system

logger = get_logger(__name__)
settings = get_system().settings

#: What a report's ``kind`` may be: it becomes part of a file name.
KIND = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


class InvalidReport(Exception):
    """The message asks for a report that can never be written (its kind, day or rows)."""


def sample_rows(kind: str, day: date, count: int = 50) -> list[dict[str, Any]]:
    """Deterministic synthetic rows for ``kind`` on ``day`` (the same inputs give the same report)."""
    rng = random.Random(f"{kind}:{day.isoformat()}")
    regions = ["north", "south", "east", "west"]
    return [
        {
            "date": day.isoformat(),
            "order_id": f"ord-{day:%Y%m%d}-{i:04d}",
            "region": rng.choice(regions),
            "amount": f"{rng.uniform(5, 500):.2f}",
        }
        for i in range(count)
    ]


def columns(rows: list[dict[str, Any]]) -> list[str]:
    """The CSV's columns: the first row's keys. Raises :class:`InvalidReport` (repeating none of
    the values) unless ``rows`` is a list of objects whose keys are all the first one's."""
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise InvalidReport("rows must be a list of objects")
    if not rows:
        return ["empty"]
    names = list(rows[0])
    known = set(names)
    if any(not known.issuperset(row) for row in rows):
        raise InvalidReport("a row has a column the first row lacks")
    return names


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write ``rows`` atomically: a reader never sees a half-written report, and a failed write
    leaves no partial file behind."""
    names = columns(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path, "x", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=names)
        writer.writeheader()
        writer.writerows(rows)


@dramatiq.actor(queue_name=settings.queue("reports"), time_limit=120_000)
def report_failed(
    message_id: str,
    actor: str,
    reason: str,
    exception: str,
    error: str,
    args: list[Any],
    kwargs: dict[str, Any],
) -> None:
    """The dead-letter hook of ``generate_report``: tell whoever asked for it that it failed.

    The mail's idempotency key is the failed report's: one mail per failed report, however often
    this hook runs for it, and a user's next failed report is mailed too.
    """
    logger.warning("report_failed", report_message_id=message_id, reason=reason, exception=exception)
    if kwargs.get("email_to"):
        send_email.send_with_options(
            kwargs={
                "to": kwargs["email_to"],
                "template": "report_failed",
                "context": {"kind": kwargs.get("kind", args[0] if args else "report"), "job": message_id},
            },
            idempotency_key=f"report_failed:{message_id}",
        )


def _report_day(day: str | None) -> date:
    try:
        return date.fromisoformat(day) if day else datetime.now(UTC).date()
    except (TypeError, ValueError):
        raise InvalidReport("day must be a date such as 2026-11-02") from None


@dramatiq.actor(
    queue_name=settings.queue("reports"),
    time_limit=900_000,
    throws=(InvalidReport, OutsideDirectory),
    on_dead_letter="report_failed",
)
def generate_report(
    kind: str,
    rows: list[dict[str, Any]] | None = None,
    email_to: str | None = None,
    day: str | None = None,
) -> str:
    """Write the ``kind`` report as CSV in ``REPORTS_DIR`` and, with ``email_to``, enqueue its
    delivery; returns the path. ``kind`` is a name: letters, digits, ``_`` and ``-``."""
    if not isinstance(kind, str) or not KIND.fullmatch(kind):
        raise InvalidReport("kind must be a name of letters, digits, _ and - (at most 64)")
    report_day = _report_day(day)
    data = rows if rows is not None else sample_rows(kind, report_day)
    message = CurrentMessage.get_current_message()
    job = message.message_id if message is not None else "local"
    name = f"{kind}-{report_day.isoformat()}-{job}.csv"  # the message id too comes from the message
    path = inside(settings.reports_dir, name, what="the report", setting="REPORTS_DIR")
    write_csv(path, data)
    logger.info("report_written", kind=kind, rows=len(data), path=str(path))
    if email_to:
        send_email.send(to=email_to, template="report", context={"kind": kind}, attachment=str(path))
    return str(path)


@dramatiq.actor(queue_name=settings.queue("reports"), time_limit=300_000)
def purge_exports(max_age_hours: float = 24.0) -> int:
    """Delete report files older than ``max_age_hours``, and partial ones a killed job left;
    returns how many it removed."""
    cutoff = time.time() - max_age_hours * 3600
    removed = 0
    for pattern in ("*.csv", f"*{PARTIAL_SUFFIX}"):
        for path in settings.reports_dir.glob(pattern):
            try:
                if path.stat().st_mtime >= cutoff:
                    continue
            except FileNotFoundError:  # replaced or purged meanwhile
                continue
            path.unlink(missing_ok=True)
            removed += 1
    logger.info("exports_purged", removed=removed, max_age_hours=max_age_hours)
    return removed
