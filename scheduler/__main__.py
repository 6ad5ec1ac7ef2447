"""``python -m scheduler [MODULE ...] [--schedules PATH] [--check]``: send the schedules' messages.

MODULE names extra modules that declare actors (as for ``dramatiq actors MODULE``); ``actors`` is
always imported. ``--check`` validates the schedules file and prints the next fire times, sending
nothing. Exit codes: 0 on a clean stop (SIGTERM, SIGINT), 2 for bad settings or schedules.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType

from jobctl.project import import_modules, load_project
from scheduler.schedules import DEFAULT_FILE, Schedule, ScheduleError, load_schedules
from scheduler.triggers import format_duration, next_fires

EXIT_OK, EXIT_CONFIG = 0, 2


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m scheduler",
        description="Send periodic messages to the actors, safely from many replicas.",
    )
    parser.add_argument("modules", nargs="*", metavar="MODULE", help="extra modules that declare actors")
    parser.add_argument(
        "--schedules", type=Path, metavar="PATH", help="schedules file (default: SCHEDULES_FILE, then ours)"
    )
    parser.add_argument("--check", action="store_true", help="validate, print next fire times, send nothing")
    return parser.parse_args(argv)


def describe(schedules: list[Schedule], queues: dict[str, str], count: int = 3) -> str:
    """What ``--check`` prints: each schedule, where it sends, and its next fire times."""
    now = datetime.now(UTC)
    lines = []
    for schedule in schedules:
        state = "" if schedule.enabled else "  (disabled)"
        lines.append(
            f"{schedule.id}: {schedule.actor} on {queues[schedule.id]}, {schedule.spec}, "
            f"misfire grace {format_duration(schedule.misfire_grace)}{state}"
        )
        for fire in next_fires(schedule.trigger, now, count):
            lines.append(f"  {fire.isoformat()}  ({fire.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    arguments = _arguments(argv)
    system = load_project("scheduler")  # exits 2 on bad settings
    import_modules("scheduler", arguments.modules)

    from jobsystem.observability.logs import get_logger
    from scheduler.checkins import sentry_checkins
    from scheduler.service import Scheduler, queue_of

    logger = get_logger("scheduler")
    # APScheduler logs every job run at INFO; the scheduler's own events say what matters.
    logging.getLogger("apscheduler").setLevel(max(logging.getLogger().level, logging.WARNING))
    settings, broker = system.settings, system.broker
    path = arguments.schedules or settings.schedules_file or DEFAULT_FILE
    try:
        schedules = load_schedules(path, broker.actors, max_priority=settings.rabbitmq_max_priority)
    except ScheduleError as exc:
        if arguments.check:
            sys.stderr.write("".join(f"scheduler: {path}: {problem}\n" for problem in exc.problems))
        else:
            logger.error("schedules_invalid", path=str(path), problems=exc.problems)
        return EXIT_CONFIG
    if arguments.check:
        queues = {s.id: queue_of(s, broker, settings) for s in schedules}
        print(f"{path}: {len(schedules)} schedule{'' if len(schedules) == 1 else 's'}, valid")
        print(describe(schedules, queues))
        return EXIT_OK

    scheduler = Scheduler(
        schedules,
        broker=broker,
        store=system.store,
        settings=settings,
        checkins=sentry_checkins(settings, schedules),
    )

    def stop(signum: int, frame: FrameType | None) -> None:
        scheduler.stop_on_signal(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    scheduler.run()
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
