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
import json
import signal
import sys
from pathlib import Path
from typing import Any

from pika.exceptions import AMQPError
from rich.console import Console
from rich.live import Live

from demo import services
from demo.run import Demo
from demo.view import render
from jobsystem.settings import SettingsError

EXIT_OK, EXIT_FAILED, EXIT_CONFIG, EXIT_INTERRUPTED = 0, 1, 2, 130


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
        f"\nCleaned up: {len(cleaned.get('queues_deleted', []))} queues, "
        f"{len(cleaned.get('exchanges_deleted', []))} exchanges and "
        f"{cleaned.get('state_keys_deleted', 0)} state keys under {prefix!r}"
        + (f"; {cleaned['queues_error']}" if "queues_error" in cleaned else "")
        + (f"; {cleaned['state_error']}" if "state_error" in cleaned else "")
    )
    console.print(
        "\nLook closer (on a running system; add QUEUE_PREFIX=... to see another environment's queues):\n"
        "  jobctl health                 queues: waiting, running, delayed, dead letters, rates\n"
        "  jobctl status MESSAGE_ID      one job's state and progress (the id send() returned)\n"
        "  jobctl dlq list               dead letters, with their final error\n"
        "  jobctl dlq retry --all        replay them once the cause is fixed\n"
        "  make run / make scheduler     the worker and the scheduler the demo started"
    )


def main(argv: list[str] | None = None) -> int:
    arguments = _arguments(argv)
    console = Console()
    try:
        demo = Demo(arguments)
    except SettingsError as exc:
        console.print(exc.report("demo").rstrip("\n"), markup=False)
        return EXIT_CONFIG
    # SIGTERM (a `timeout`) and SIGHUP (a closed terminal, a dropped SSH session) stop the run as
    # Ctrl-C does: with the clean-up.
    for stop in _STOP_SIGNALS[1:]:
        signal.signal(stop, signal.default_int_handler)
    outcome, error = EXIT_FAILED, ""
    summary: dict[str, Any] = {}
    try:
        with Live(render(demo.snapshot), console=console, refresh_per_second=4, transient=False) as live:
            try:
                outcome = EXIT_OK if demo.run(live) else EXIT_FAILED
            finally:
                with _no_interrupts():
                    summary = demo.summary() if demo.system is not None else {}
                    demo.snapshot.phase = "stopping the worker and the scheduler, deleting queues and keys"
                    live.update(render(demo.snapshot))
    except KeyboardInterrupt:
        outcome, error = EXIT_INTERRUPTED, "interrupted"
    except (RuntimeError, TimeoutError, OSError, AMQPError) as exc:  # RabbitMQ down at start: AMQPError
        error = services.error_line(demo.settings, exc)
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
                    "swept": demo.swept,
                },
                indent=2,
            )
        )
    return outcome


#: The signals that stop the demo with its clean-up: Ctrl-C, then those ``main`` maps onto it.
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _no_interrupts:
    """The stop signals are ignored while the demo cleans up: the clean-up must finish to leave
    nothing behind (a second SIGTERM would otherwise cut it off halfway)."""

    def __enter__(self) -> None:
        self._previous = {stop: signal.signal(stop, signal.SIG_IGN) for stop in _STOP_SIGNALS}

    def __exit__(self, *exc: object) -> None:
        for stop, handler in self._previous.items():
            signal.signal(stop, handler)


if __name__ == "__main__":
    sys.exit(main())
