"""``python -m scheduler``: until schedules are configured, an idle APScheduler process that stops cleanly."""

from __future__ import annotations

import signal
from types import FrameType

from apscheduler.schedulers.blocking import BlockingScheduler

from actors.logs import get_logger

logger = get_logger("scheduler")


def main() -> None:
    scheduler = BlockingScheduler(timezone="UTC")

    def stop(signum: int, frame: FrameType | None) -> None:
        logger.info("scheduler_stopping", signal=signal.Signals(signum).name)
        scheduler.shutdown(wait=False)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    logger.info("scheduler_started", schedules=len(scheduler.get_jobs()))
    scheduler.start()


if __name__ == "__main__":
    main()
