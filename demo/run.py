"""One demo run: its environment, its processes, the workload sent through the reference actors,
and the clean-up that leaves nothing behind."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import time
import uuid
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.live import Live

from demo import services
from demo.alive import AliveQueue
from demo.folders import folder_for, hold_folder, vhost_of
from demo.sweep import sweep_dead_demos
from demo.view import Snapshot, render
from demo.watch import Watching
from jobsystem.settings import Settings, load_settings
from jobsystem.system import System
from jobsystem.urls import redact_url


@dataclass(frozen=True)
class Profile:
    """The size and pace of a run."""

    recipients: int  # campaign size
    resent: int  # campaign mails re-sent by mistake (all dropped as duplicates)
    smtp_rate: float  # mails per second, for the whole worker group
    smtp_burst: int
    media_jobs: int
    image_size: tuple[int, int]
    partner_jobs: int  # order syncs that fail into the dead letters, then are replayed
    health_every: str  # the scheduler's check_health interval
    timeout_s: float  # the run gives up (and cleans up) after this long


#: About 1.5 minutes: the campaign's 300 mails at 4 a second set the pace.
FULL = Profile(300, 50, 4.0, 20, 3, (6000, 4000), 3, "10s", 600.0)
#: About 20 seconds, for the test and a quick look.
SHORT = Profile(40, 10, 10.0, 10, 1, (2400, 1600), 3, "5s", 240.0)

#: Retries of the demo's jobs: short, so the failing syncs reach the dead letters in seconds.
RETRY_ENV = {"JOB_MAX_RETRIES": "2", "JOB_MIN_BACKOFF_MS": "500", "JOB_MAX_BACKOFF_MS": "2000"}


class Demo(Watching):
    """One run; :meth:`shutdown` stops its processes and deletes its queues and keys, whatever happened."""

    def __init__(self, arguments: argparse.Namespace) -> None:
        self.arguments = arguments
        self.system: System | None = None  # built once the environment carries the demo's variables
        self.profile = SHORT if arguments.short else FULL
        self.prefix = f"demo-{uuid.uuid4().hex[:6]}-"
        configured = load_settings()  # SettingsError: stop before anything started
        self.tmp = folder_for(self.prefix)  # created once the alive queue is held (start)
        self.folder_lock: int | None = None  # the descriptor holding the folder's lock
        self.env = self._environment(configured)
        self.settings: Settings = load_settings(self.env)
        self.mail_server = None if arguments.smtp_url else services.MailServer()
        self.partner = services.PartnerApi()
        self.children: list[services.Child] = []
        self.started = time.monotonic()
        self.snapshot = Snapshot(prefix=self.prefix)
        self.figures: dict[str, Any] = {"sent": 0, "deduplicated": 0, "dead_lettered": 0, "replayed": 0}
        self.messages: dict[str, list[str]] = {}
        self.history: deque[tuple[float, dict[str, int]]] = deque(maxlen=20)
        self.cleaned: dict[str, Any] = {}
        self.alive: AliveQueue | None = None
        self.swept: dict[str, Any] = {}
        self.sweep_note = ""

    # -- set-up ----------------------------------------------------------------------------------

    def _environment(self, configured: Settings) -> dict[str, str]:
        """The variables of this process and its children: the configured broker and store, the
        demo's prefix, mail server, pace and short retries."""
        profile = self.profile
        state_url = configured.state_url
        if not state_url.startswith(("redis://", "rediss://")):
            state_url = f"sqlite:///{self.tmp / 'state.db'}"  # one host: a file removed at the end
        overrides = {
            "QUEUE_PREFIX": self.prefix,
            "STATE_URL": state_url,
            "RATE_LIMITS": json.dumps({"smtp": {"rate": profile.smtp_rate, "burst": profile.smtp_burst}}),
            "REPORTS_DIR": str(self.tmp / "reports"),
            "MEDIA_DIR": str(self.tmp / "media"),
            "SCHEDULES_FILE": str(self.tmp / "schedules.toml"),
            "LOG_FORMAT": "json",
            "LOG_LEVEL": "INFO",
            "PROMETHEUS_PORT": "0",  # another worker group may hold the default port
            "SENTRY_DSN": "",  # the demo's failures are on purpose
            "WORKER_SHUTDOWN_TIMEOUT_MS": "20000",
            **RETRY_ENV,
        }
        if self.arguments.smtp_url:
            overrides["SMTP_URL"] = self.arguments.smtp_url
        return {**os.environ, **overrides}

    def event(self, what: str) -> None:
        self.snapshot.events.append((time.monotonic() - self.started, what))

    def claim_prefix(self) -> None:
        """Declare the demo's alive queue, before anything else under its prefix, then remove what
        dead demos left behind. A failed sweep is only noted: the run goes on without it."""
        from jobsystem.rabbitmq.broker import connection_urls

        self.alive = AliveQueue(connection_urls(self.settings)[0], self.prefix)
        self.alive.start()
        try:
            swept = sweep_dead_demos(self.settings, self.prefix)
        except Exception as exc:  # the management API or Redis down: the leftovers wait
            self.swept = {"error": type(exc).__name__}  # its message may carry the API's password
            self.sweep_note = f"Leftovers of dead demos not swept: {type(exc).__name__}"
            return
        self.swept = {"demos": swept.demos, "leftovers": swept.leftovers, "expiring": swept.keys_expiring}
        self.sweep_note = swept.line() if swept.demos or swept.keys_expiring else ""

    def start(self) -> None:
        """Start the mail server, the partner API (down), the worker and the scheduler."""
        self.claim_prefix()
        # After the alive queue and the sweep: a live demo's folder is never seen without its
        # alive queue, and one killed while sweeping leaves none. Held until the demo and its
        # children end: a later sweep removes it once they all did, however they ended.
        lock = self.folder_lock = hold_folder(self.tmp, vhost_of(self.settings.rabbitmq_url))
        if self.mail_server is not None:
            self.env["SMTP_URL"] = self.mail_server.start()
            self.settings = load_settings(self.env)
        self.partner_url = self.partner.start()
        os.environ.update(self.env)  # before the system is built: this process sends under the prefix
        (self.tmp / "schedules.toml").write_text(
            '[[schedule]]\nid = "queue-health"\nactor = "check_health"\n'
            f'every = "{self.profile.health_every}"\n'
        )
        self.event(f"mail to {redact_url(self.settings.smtp_url)}; partner API at {self.partner_url} (down)")
        held = (lock,)  # the children hold it too: a killed demo's worker may still finish jobs in it
        worker = services.start_worker(self.env, self.tmp / "worker.log", ["demo.tasks"], held)
        self.children.append(worker)
        self.children.append(
            services.start_scheduler(self.env, self.tmp / "scheduler.log", self.tmp / "schedules.toml", held)
        )
        self.snapshot.processes = (
            f"· worker pid {worker.proc.pid} "
            f"({self.settings.worker_processes} processes x {self.settings.worker_threads} threads)"
            f" · scheduler pid {self.children[1].proc.pid}"
        )
        from jobsystem.system import get_system

        system = get_system()
        if system.settings.queue_prefix != self.prefix:
            # Something built the system before the demo's variables were set: its actors would
            # use the configured queues. Stop before sending anything there.
            raise RuntimeError("the system was built before the demo set QUEUE_PREFIX")
        import actors  # noqa: F401 - declares the reference actors on the system's broker
        from demo import tasks

        # The view is this process's output: its own INFO lines (the mail server's dialogue,
        # dropped duplicates) would scroll through it. The children log to their files.
        logging.getLogger().setLevel(logging.WARNING)

        self.system, self.tasks = system, tasks
        self.settings = system.settings  # the same variables, now read by the project itself
        self.queues = {
            "emails": self.settings.queue("emails"),
            "reports": self.settings.queue("reports"),
            "media": self.settings.queue("media"),
            "partner": self.settings.queue("partner"),
            "health": self.settings.queue("health"),
        }

    def workers_ready(self) -> bool:
        return services.worker_ready(self.children[0], self.settings.worker_processes)

    # -- the workload ----------------------------------------------------------------------------

    def _sent(self, name: str, message: Any) -> None:
        if message.options.get("duplicate"):
            self.figures["deduplicated"] += 1
        else:
            self.figures["sent"] += 1
            self.messages.setdefault(name, []).append(message.message_id)

    def send_first_wave(self) -> None:
        """Everything but the campaign: the syncs that will fail, reports, images, a welcome mail."""
        from actors.emails import send_email
        from actors.media import make_renditions
        from actors.reports import generate_report

        for batch in range(1, self.profile.partner_jobs + 1):
            self._sent("partner", self.tasks.sync_orders.send(self.partner_url, batch))
        self.event(
            f"{self.profile.partner_jobs} order syncs sent; the partner API answers 503: "
            "retries, then dead letters"
        )
        for kind, to in (("sales", "boss@example.com"), ("inventory", "ops@example.com")):
            self._sent("reports", generate_report.send(kind, email_to=to))
        self.event("2 reports requested: written as CSV, then mailed")
        for source in self.images:
            self._sent("media", make_renditions.send(str(source)))
        self.event(f"{self.profile.media_jobs} image(s) uploaded: renditions at 4 sizes, progress per stage")
        for _ in range(3):  # a user who clicks "send" three times
            self._sent(
                "welcome",
                send_email.send(to="newcomer@example.com", template="welcome", context={"name": "Sam"}),
            )
        self.event("welcome mail sent 3 times (a double click): the idempotency key drops 2")

    def _make_image(self, number: int) -> Path:
        from PIL import Image

        width, height = self.profile.image_size
        folder = self.tmp / "media" / "uploads"  # make_renditions reads inside MEDIA_DIR only
        folder.mkdir(parents=True, exist_ok=True)
        bands = (
            Image.linear_gradient("L").resize((width, height)),
            Image.radial_gradient("L").resize((width, height)),
            Image.effect_noise((width, height), 40 + 10 * number),
        )
        path = folder / f"photo-{number + 1}.jpg"
        Image.merge("RGB", bands).save(path, quality=90)
        return path

    def recipients(self) -> list[str]:
        return [f"customer{i:04d}@example.com" for i in range(self.profile.recipients)]

    CAMPAIGN = "spring-sale"
    CONTEXT = {"headline": "Spring sale", "text": "Everything 20% off this week."}  # noqa: RUF012

    def send_campaign(self) -> None:
        from actors.emails import send_campaign

        self._sent("campaign", send_campaign.send(self.CAMPAIGN, self.recipients(), self.CONTEXT))
        self.event(
            f"campaign to {self.profile.recipients} recipients: one job fans it out with one bulk send"
        )

    def resend_part_of_campaign(self) -> None:
        """The marketing tool retries: the first recipients' mails are sent again, and dropped."""
        from actors.emails import campaign_messages
        from jobsystem.rabbitmq.bulk import send_bulk

        again = campaign_messages(self.CAMPAIGN, self.recipients()[: self.profile.resent], self.CONTEXT)
        for message in send_bulk(again):
            self._sent("campaign-resent", message)
        self.event(f"{self.profile.resent} campaign mails sent again by mistake: all dropped at send")

    def replay_dead_letters(self) -> None:
        """The partner is back: replay the dead letters (what `jobctl dlq retry --all` does)."""
        from jobsystem.ops import dead_letters as ops
        from jobsystem.rabbitmq.broker import dead_letter_queue

        self.partner.up = True
        assert self.system is not None
        outcome = ops.replay(self.system.broker, [dead_letter_queue(self.queues["partner"])], ops.Filters())
        self.figures["replayed"] += outcome.done
        self.event(f"partner API back up; {outcome.done} dead letters replayed to their queue")

    # -- watching --------------------------------------------------------------------------------

    # -- the run ---------------------------------------------------------------------------------

    def run(self, live: Live) -> bool:
        """Drive the workload to its end; returns True when everything it expects happened."""
        profile = self.profile
        self.start()
        if self.sweep_note:
            live.console.print(self.sweep_note, markup=False)
        from jobsystem.ops.status import get_status

        self.snapshot.phase = "starting the worker and the scheduler"
        deadline = self.started + profile.timeout_s
        self.images = [self._make_image(number) for number in range(profile.media_jobs)]  # the uploads
        while not self.workers_ready():
            self._tick(live, deadline)
        self.snapshot.phase = "running the workload"
        self.send_first_wave()
        campaign_sent = resent = replayed = False
        tick = 0
        while True:
            tick += 1
            succeeded = self.measure(with_broker=tick % 2 == 1)
            live.update(render(self.snapshot))
            if not campaign_sent and (succeeded["reports"] >= 2 or time.monotonic() - self.started > 15):
                self.send_campaign()  # after the report mails, so they do not wait behind it
                campaign_sent = True
            campaign_ids = self.messages.get("campaign", [])
            if campaign_sent and not resent and campaign_ids:
                status = get_status(campaign_ids[0])
                if status is not None and status.state == "succeeded":
                    self.resend_part_of_campaign()
                    resent = True
            partner = next(r for r in self.snapshot.queues if r.name == "partner")
            dead_letters = partner.dead or 0
            if not replayed and min(self.figures["dead_lettered"], dead_letters) >= profile.partner_jobs:
                self.event(
                    f"{profile.partner_jobs} syncs dead-lettered after "
                    f"{1 + int(RETRY_ENV['JOB_MAX_RETRIES'])} attempts each"
                )
                self.replay_dead_letters()
                replayed = True
            if replayed and resent and self._finished(succeeded):
                self.measure(with_broker=True)
                self.snapshot.phase = "done"
                self.event("every job ran; stopping the worker and the scheduler")
                live.update(render(self.snapshot))
                return True
            self._tick(live, deadline, 0.5)

    def _finished(self, succeeded: dict[str, int]) -> bool:
        profile = self.profile
        mails = self.mails_delivered()
        return (
            succeeded["emails"] >= profile.recipients + 4
            and succeeded["reports"] >= 2
            and succeeded["media"] >= profile.media_jobs
            and len(self.partner.synced) >= profile.partner_jobs
            and (mails is None or mails >= profile.recipients + 3)
        )

    def _tick(self, live: Live, deadline: float, seconds: float = 0.2) -> None:
        for child in self.children:
            if not child.alive():
                raise RuntimeError(
                    f"the {child.name} exited with code {child.proc.returncode}:\n{child.output()[-3000:]}"
                )
        if time.monotonic() > deadline:
            raise TimeoutError(f"the workload did not finish within {self.profile.timeout_s:g} s")
        self.snapshot.elapsed_s = time.monotonic() - self.started
        live.update(render(self.snapshot))
        time.sleep(seconds)

    # -- the end ---------------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop the children (SIGTERM to each main process), then delete what the demo made in
        RabbitMQ and the state store."""
        if self.system is not None:
            services.abandon_connection(self.system.broker)
        for child in reversed(self.children):
            code = child.stop(timeout=30.0)
            self.cleaned[f"{child.name}_exit"] = code
        if self.system is not None:
            from jobsystem.runtime.deferred import DeferredWrites

            for middleware in self.system.broker.middleware:
                writes = getattr(middleware, "writes", None)
                if isinstance(writes, DeferredWrites):
                    writes.flush(5.0)  # this process's last status writes, before the keys go
            declared = sorted(self.system.broker.get_declared_queues())
            self.system.broker.close()
        else:
            declared = []
        try:
            queues, exchanges = services.delete_topology(self.settings, self.prefix, declared)
            self.cleaned["queues_deleted"], self.cleaned["exchanges_deleted"] = queues, exchanges
        except Exception as exc:
            self.cleaned["queues_error"] = services.error_line(self.settings, exc)
        try:
            self.cleaned["state_keys_deleted"] = services.delete_state_keys(self.settings, self.prefix)
        except Exception as exc:
            self.cleaned["state_error"] = services.error_line(self.settings, exc)
        if self.mail_server is not None:
            self.mail_server.stop()
        self.partner.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)
        if self.folder_lock is not None:
            os.close(self.folder_lock)
            self.folder_lock = None
        if self.alive is not None:
            self.alive.close()  # last: until now a concurrent demo's sweep must see this one alive
