"""What the demo watches while it runs: queue progress and rates, broker numbers, the images'
progress, its figures, and the summary at the end (all read from the job-status records and
RabbitMQ, as an operator would)."""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path
from typing import Any

from demo import services
from demo.view import MediaRow, QueueRow, Snapshot
from jobsystem.settings import Settings


class Watching:
    """The watching half of a demo run (:class:`demo.run.Demo` sets these attributes)."""

    profile: Any
    prefix: str
    settings: Settings
    queues: dict[str, str]
    snapshot: Snapshot
    history: deque[tuple[float, dict[str, int]]]
    figures: dict[str, Any]
    messages: dict[str, list[str]]
    partner: services.PartnerApi
    mail_server: services.MailServer | None
    started: float
    tmp: Path

    def measure(self, with_broker: bool) -> dict[str, int]:
        """Refresh the snapshot; returns jobs succeeded per queue (the job-status counters)."""
        from jobsystem.ops.status import queue_totals

        names = list(self.queues.values())
        totals = queue_totals(names)
        succeeded = {short: totals.get(q, {}).get("succeeded", 0) for short, q in self.queues.items()}
        now = time.monotonic()
        self.history.append((now, succeeded))
        rows = self._queue_rows(succeeded, now)
        if with_broker:
            self._broker_numbers(rows)
        self.snapshot.queues = list(rows.values())
        self.figures["dead_lettered"] = sum(totals.get(q, {}).get("dead", 0) for q in names)
        self.snapshot.media = self._media_rows()
        self.snapshot.elapsed_s = now - self.started
        self.snapshot.figures = self._figures()
        return succeeded

    def _queue_rows(self, succeeded: dict[str, int], now: float) -> dict[str, QueueRow]:
        """Each queue's progress against what the workload sends it, and its recent rate."""
        then, before = self.history[0]
        rows = {r.name: r for r in self.snapshot.queues} or {short: QueueRow(short) for short in self.queues}
        expected = {
            "emails": self.profile.recipients + 4,  # the campaign's mails, its fan-out, 2 reports, 1 welcome
            "reports": 2,
            "media": self.profile.media_jobs,
            "partner": self.profile.partner_jobs,
            "health": succeeded["health"],
        }
        for short, row in rows.items():
            row.done, row.expected = succeeded[short], expected[short]
            row.rate = (succeeded[short] - before[short]) / (now - then) if now > then else 0.0
        rows["partner"].note = "API up" if self.partner.up else "API down"
        rows["health"].note = "scheduled"
        rows["emails"].note = f"smtp {self.profile.smtp_rate:g}/s"
        return rows

    def _broker_numbers(self, rows: dict[str, QueueRow]) -> None:
        """Waiting, running, delayed and dead messages per queue, as ``jobctl health`` reads them."""
        from jobsystem.ops.health import measure

        try:
            measured, _, _ = measure(self.settings, list(self.queues.values()), timeout=5.0, peek=False)
        except ConnectionError:
            measured = []
        by_name = {h.queue: h for h in measured}
        for short, row in rows.items():
            health = by_name.get(self.queues[short])
            if health is not None:
                row.waiting, row.running = health.waiting, health.in_progress
                row.delayed, row.dead = health.delayed, health.dead

    def _media_rows(self) -> list[MediaRow]:
        """The images' progress, read with ``get_status`` as an application polls it."""
        from jobsystem.ops.status import get_status

        rows = []
        for number, message_id in enumerate(self.messages.get("media", []), start=1):
            status = get_status(message_id)
            rows.append(
                MediaRow(
                    f"photo-{number}.jpg",
                    state=status.state if status else "queued",
                    progress=(status.progress or 0.0) if status else 0.0,
                    note=(status.note or "") if status else "",
                )
            )
        return rows

    def _figures(self) -> dict[str, str]:
        mails = self.mails_delivered()
        return {
            "mails delivered": "-" if mails is None else str(mails),
            "sent": str(self.figures["sent"]),
            "duplicates dropped": str(self.figures["deduplicated"]),
            "rate-limited waits": str(self.rate_limited_waits()),
            "dead-lettered": str(self.figures["dead_lettered"]),
            "replayed": str(self.figures["replayed"]),
            "partner syncs ok": str(len(self.partner.synced)),
        }

    def mails_delivered(self) -> int | None:
        return None if self.mail_server is None else self.mail_server.count()

    def rate_limited_waits(self) -> int:
        return services.count_events(self.tmp / "worker.log", "rate_limited")

    def summary(self) -> dict[str, Any]:
        """The figures of the run (before clean-up: they are read from the state store)."""
        from jobsystem.ops.status import get_status

        running = getattr(self, "system", None) is not None
        succeeded = self.measure(with_broker=False) if running else {}
        media = [get_status(m) for m in self.messages.get("media", [])] if running else []
        campaign = self.messages.get("campaign", [])
        fanned_out = get_status(campaign[0]) if campaign else None
        return {
            "prefix": self.prefix,
            "elapsed_s": round(time.monotonic() - self.started, 1),
            "sent": self.figures["sent"]
            + (int(fanned_out.result) if fanned_out and fanned_out.result else 0),
            "run": sum(succeeded.values()),
            "run_per_queue": succeeded,
            "deduplicated": self.figures["deduplicated"],
            "rate_limited_waits": self.rate_limited_waits(),
            "dead_lettered": self.figures["dead_lettered"],
            "replayed": self.figures["replayed"],
            "mails_delivered": self.mails_delivered(),
            "mails_sent": max(succeeded.get("emails", 0) - len(campaign), 0),
            "campaign_recipients": self.profile.recipients,
            "campaign_fanned_out": fanned_out.result if fanned_out else None,
            "partner_syncs_ok": len(self.partner.synced),
            "partner_calls_refused": self.partner.failed,
            "scheduler_health_checks": succeeded.get("health", 0),
            "media": [m.to_dict() for m in media if m is not None],
            "message_ids": self.messages,
        }
