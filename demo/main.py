"""The demo run: set up its environment, start the worker and scheduler, drive the workload, watch
it live, print the summary, and leave nothing behind.

The workload, through the reference actors:

- an email campaign fanned out by one bulk send (``send_campaign``), held to the ``smtp`` rate
  limit, to a mail server in this process (or ``--smtp-url``, e.g. Mailpit);
- reports generated as CSV and mailed (``generate_report``), and a welcome mail;
- image renditions (``make_renditions``) whose progress is read with ``get_status``;
- duplicate sends dropped by idempotency keys (a welcome mail clicked three times, part of the
  campaign re-sent by mistake);
- order syncs to a partner API that is down: retried, dead-lettered, then replayed once it is
  back (the failed-job workflow of ``jobctl dlq retry``);
- the scheduler running ``check_health`` on a schedule, as in production.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.live import Live

from demo import services
from demo.view import MediaRow, QueueRow, Snapshot, render

if TYPE_CHECKING:
    from jobsystem.settings import Settings

EXIT_OK, EXIT_FAILED, EXIT_CONFIG, EXIT_INTERRUPTED = 0, 1, 2, 130


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


def settings_module() -> ModuleType:
    """``jobsystem/settings.py`` loaded on its own, to read the configured settings *without*
    ``import actors``: that builds the broker, the store and the actors' queue names from the
    environment, which must first carry the demo's prefix and store.

    Its one import from the package, ``jobsystem.urls``, is loaded on its own too, under its own name
    for the time of the load: Python takes a submodule found in ``sys.modules`` without importing
    its package."""
    package = importlib.util.find_spec("actors")
    assert package is not None and package.submodule_search_locations
    folder = Path(package.submodule_search_locations[0])
    borrowed = None if "jobsystem.urls" in sys.modules else _load("jobsystem.urls", folder / "urls.py")
    try:
        return _load("demo._configured_settings", folder / "settings.py")
    finally:
        if borrowed is not None:
            del sys.modules["jobsystem.urls"]  # ``import actors`` later loads it as part of the package


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pydantic resolves the annotations through it
    spec.loader.exec_module(module)
    return module


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m demo",
        description="Run a realistic mixed workload through the whole system and watch it live.",
    )
    parser.add_argument("--short", action="store_true", help="a ~20 s run with a smaller workload")
    parser.add_argument(
        "--smtp-url",
        metavar="URL",
        help="deliver mail to this SMTP server (e.g. Mailpit), not to one in this process",
    )
    parser.add_argument("--json-summary", type=Path, metavar="PATH", help="also write the summary as JSON")
    return parser.parse_args(argv)


class Demo:
    """One run; :meth:`shutdown` stops its processes and deletes its queues and keys, whatever happened."""

    def __init__(self, arguments: argparse.Namespace, config: ModuleType) -> None:
        self.arguments = arguments
        self.config = config
        self.profile = SHORT if arguments.short else FULL
        self.prefix = f"demo-{uuid.uuid4().hex[:6]}-"
        configured = config.load_settings()  # SettingsError: stop before anything started
        self.tmp = Path(tempfile.mkdtemp(prefix="jobs-demo-"))
        self.env = self._environment(configured)
        self.settings: Settings = config.load_settings(self.env)
        self.mail_server = None if arguments.smtp_url else services.MailServer()
        self.partner = services.PartnerApi()
        self.children: list[services.Child] = []
        self.started = time.monotonic()
        self.snapshot = Snapshot(prefix=self.prefix)
        self.figures: dict[str, Any] = {"sent": 0, "deduplicated": 0, "dead_lettered": 0, "replayed": 0}
        self.messages: dict[str, list[str]] = {}
        self.history: deque[tuple[float, dict[str, int]]] = deque(maxlen=20)
        self.cleaned: dict[str, Any] = {}

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

    def start(self) -> None:
        """Start the mail server, the partner API (down), the worker and the scheduler."""
        if self.mail_server is not None:
            self.env["SMTP_URL"] = self.mail_server.start()
            self.settings = self.config.load_settings(self.env)
        self.partner_url = self.partner.start()
        os.environ.update(self.env)  # before `import actors`: this process sends under the prefix
        (self.tmp / "schedules.toml").write_text(
            '[[schedule]]\nid = "queue-health"\nactor = "check_health"\n'
            f'every = "{self.profile.health_every}"\n'
        )
        self.event(
            f"mail to {self.config.redact_url(self.settings.smtp_url)}; "
            f"partner API at {self.partner_url} (down)"
        )
        worker = services.start_worker(self.env, self.tmp / "worker.log", ["demo.tasks"])
        self.children.append(worker)
        self.children.append(
            services.start_scheduler(self.env, self.tmp / "scheduler.log", self.tmp / "schedules.toml")
        )
        self.snapshot.processes = (
            f"· worker pid {worker.proc.pid} "
            f"({self.settings.worker_processes} processes x {self.settings.worker_threads} threads)"
            f" · scheduler pid {self.children[1].proc.pid}"
        )
        import actors
        from demo import tasks

        # The view is this process's output: its own INFO lines (the mail server's dialogue,
        # dropped duplicates) would scroll through it. The children log to their files.
        logging.getLogger().setLevel(logging.WARNING)

        self.actors, self.tasks = actors, tasks
        if actors.settings.queue_prefix != self.prefix:
            # Something imported ``actors`` before the demo's variables were set: its actors would
            # use the configured queues. Stop before sending anything there.
            raise RuntimeError("`actors` was imported before the demo set QUEUE_PREFIX")
        self.settings = actors.settings  # the same variables, now read by the project itself
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
        folder = self.tmp / "uploads"
        folder.mkdir(exist_ok=True)
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
        outcome = ops.replay(self.actors.broker, [dead_letter_queue(self.queues["partner"])], ops.Filters())
        self.figures["replayed"] += outcome.done
        self.event(f"partner API back up; {outcome.done} dead letters replayed to their queue")

    # -- watching --------------------------------------------------------------------------------

    def measure(self, with_broker: bool) -> dict[str, int]:
        """Refresh the snapshot; returns jobs succeeded per queue (the job-status counters)."""
        from actors.health import measure
        from actors.status import get_status, queue_totals

        names = list(self.queues.values())
        totals = queue_totals(names)
        succeeded = {short: totals.get(q, {}).get("succeeded", 0) for short, q in self.queues.items()}
        dead = sum(totals.get(q, {}).get("dead", 0) for q in names)
        now = time.monotonic()
        self.history.append((now, succeeded))
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
        if with_broker:
            try:
                measured, _, _ = measure(self.settings, names, timeout=5.0, peek=False)
            except ConnectionError:
                measured = []
            by_name = {h.queue: h for h in measured}
            for short, row in rows.items():
                health = by_name.get(self.queues[short])
                if health is not None:
                    row.waiting, row.running = health.waiting, health.in_progress
                    row.delayed, row.dead = health.delayed, health.dead
        self.snapshot.queues = list(rows.values())
        self.figures["dead_lettered"] = dead
        self.snapshot.media = []
        for number, message_id in enumerate(self.messages.get("media", []), start=1):
            status = get_status(message_id)
            self.snapshot.media.append(
                MediaRow(
                    f"photo-{number}.jpg",
                    state=status.state if status else "queued",
                    progress=(status.progress or 0.0) if status else 0.0,
                    note=(status.note or "") if status else "",
                )
            )
        self.snapshot.elapsed_s = now - self.started
        mails = self.mails_delivered()
        self.snapshot.figures = {
            "mails delivered": "-" if mails is None else str(mails),
            "sent": str(self.figures["sent"]),
            "duplicates dropped": str(self.figures["deduplicated"]),
            "rate-limited waits": str(self.rate_limited_waits()),
            "dead-lettered": str(self.figures["dead_lettered"]),
            "replayed": str(self.figures["replayed"]),
            "partner syncs ok": str(len(self.partner.synced)),
        }
        return succeeded

    def mails_delivered(self) -> int | None:
        return None if self.mail_server is None else self.mail_server.count()

    def rate_limited_waits(self) -> int:
        return services.count_events(self.tmp / "worker.log", "rate_limited")

    # -- the run ---------------------------------------------------------------------------------

    def run(self, live: Live) -> bool:
        """Drive the workload to its end; returns True when everything it expects happened."""
        profile = self.profile
        self.start()
        from actors.status import get_status

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

    def summary(self) -> dict[str, Any]:
        """The figures of the run (before clean-up: they are read from the state store)."""
        from actors.status import get_status

        succeeded = self.measure(with_broker=False) if hasattr(self, "actors") else {}
        media = [get_status(m) for m in self.messages.get("media", [])] if hasattr(self, "actors") else []
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

    def shutdown(self) -> None:
        """Stop the children (SIGTERM to each main process), then delete the demo's queues and keys."""
        for child in reversed(self.children):
            code = child.stop(timeout=30.0)
            self.cleaned[f"{child.name}_exit"] = code
        if hasattr(self, "actors"):
            from jobsystem.runtime.deferred import DeferredWrites

            for middleware in self.actors.broker.middleware:
                writes = getattr(middleware, "writes", None)
                if isinstance(writes, DeferredWrites):
                    writes.flush(5.0)  # this process's last status writes, before the keys go
            declared = sorted(self.actors.broker.get_declared_queues())
            self.actors.broker.close()
        else:
            declared = []
        try:
            self.cleaned["queues_deleted"] = services.delete_queues(self.settings, self.prefix, declared)
        except Exception as exc:
            self.cleaned["queues_error"] = f"{type(exc).__name__}: {exc}"
        try:
            self.cleaned["state_keys_deleted"] = services.delete_state_keys(self.settings, self.prefix)
        except Exception as exc:
            self.cleaned["state_error"] = f"{type(exc).__name__}: {exc}"
        if self.mail_server is not None:
            self.mail_server.stop()
        self.partner.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)


def _print_summary(console: Console, summary: dict[str, Any], cleaned: dict[str, Any], prefix: str) -> None:
    mails = summary["mails_delivered"]
    lines = [
        ("messages sent", f"{summary['sent']}  (by the demo, plus the campaign's fan-out)"),
        (
            "jobs run",
            f"{summary['run']}  " + ", ".join(f"{q} {n}" for q, n in summary["run_per_queue"].items()),
        ),
        (
            "mails",
            f"{summary['mails_sent']} sent"
            + ("" if mails is None else f", {mails} delivered to the demo's SMTP server"),
        ),
        ("deduplicated", f"{summary['deduplicated']}  (dropped at send by their idempotency key)"),
        (
            "rate-limited",
            f"{summary['rate_limited_waits']} waits for an smtp token, slept or re-enqueued (no retry spent)",
        ),
        ("dead-lettered", f"{summary['dead_lettered']}  (partner API down: retries spent)"),
        ("replayed", f"{summary['replayed']}  ({summary['partner_syncs_ok']} partner syncs then succeeded)"),
        ("scheduler", f"{summary['scheduler_health_checks']} check_health runs"),
    ]
    width = max(len(name) for name, _ in lines)
    console.print("\n[bold]Summary[/bold]")
    for name, value in lines:
        console.print(f"  {name:<{width}}  {value}")
    console.print(
        f"\nCleaned up: {len(cleaned.get('queues_deleted', []))} queues and "
        f"{cleaned.get('state_keys_deleted', 0)} state keys under {prefix!r}"
        + (f"; {cleaned['queues_error']}" if "queues_error" in cleaned else "")
        + (f"; {cleaned['state_error']}" if "state_error" in cleaned else "")
    )
    media_id = (summary["message_ids"].get("media") or ["MESSAGE_ID"])[0]
    console.print(
        "\nLook closer (on a running system; add QUEUE_PREFIX=... to see another environment's queues):\n"
        "  jobctl health                 queues: waiting, running, delayed, dead letters, rates\n"
        f"  jobctl status {media_id}   one job's state and progress\n"
        "  jobctl dlq list               dead letters, with their final error\n"
        "  jobctl dlq retry --all        replay them once the cause is fixed\n"
        "  make run / make scheduler     the worker and the scheduler the demo started"
    )


def main(argv: list[str] | None = None) -> int:
    arguments = _arguments(argv)
    console = Console()
    config = settings_module()
    try:
        demo = Demo(arguments, config)
    except config.SettingsError as exc:
        console.print(exc.report("demo").rstrip("\n"), markup=False)
        return EXIT_CONFIG
    # SIGTERM (a `timeout`, a closed terminal) stops the run as Ctrl-C does: with the clean-up.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    outcome, error = EXIT_FAILED, ""
    summary: dict[str, Any] = {}
    try:
        with Live(render(demo.snapshot), console=console, refresh_per_second=4, transient=False) as live:
            try:
                outcome = EXIT_OK if demo.run(live) else EXIT_FAILED
            finally:
                with _no_interrupts():
                    summary = demo.summary() if hasattr(demo, "actors") else {}
                    demo.snapshot.phase = "stopping the worker and the scheduler, deleting queues and keys"
                    live.update(render(demo.snapshot))
    except KeyboardInterrupt:
        outcome, error = EXIT_INTERRUPTED, "interrupted"
    except (RuntimeError, TimeoutError, OSError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        with _no_interrupts():
            demo.shutdown()
    if error:
        console.print(f"\n[red]demo stopped: {error}[/red]")
    if summary:
        _print_summary(console, summary, demo.cleaned, demo.prefix)
    if arguments.json_summary:
        arguments.json_summary.write_text(
            json.dumps(
                {
                    "prefix": demo.prefix,
                    **summary,
                    "outcome": outcome,
                    "error": error,
                    "cleanup": demo.cleaned,
                },
                indent=2,
            )
        )
    return outcome


class _no_interrupts:
    """Ctrl-C is ignored while the demo cleans up: the clean-up must finish to leave nothing behind."""

    def __enter__(self) -> None:
        self._previous = signal.signal(signal.SIGINT, signal.SIG_IGN)

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, self._previous)


if __name__ == "__main__":
    sys.exit(main())
