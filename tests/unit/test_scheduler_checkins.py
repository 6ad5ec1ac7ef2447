"""Sentry cron check-ins of the scheduler, captured in-process by a Sentry transport: one per
schedule's monitor, and one check-in per fire (``in_progress``, then ``ok`` or ``error`` once),
however many times a send is retried while RabbitMQ refuses."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import pytest
import sentry_sdk
from sentry_sdk.transport import Transport

import scheduler.service
from jobsystem.observability.logs import configure_logging
from jobsystem.settings import load_settings
from jobsystem.system import get_system
from scheduler.checkins import CheckIns, check_in_id, monitor_config, sentry_checkins
from scheduler.schedules import Schedule, load_schedules
from scheduler.service import Scheduler, fire_key
from scheduler.triggers import CronSchedule
from tests import workload  # noqa: F401 - declares the test actors


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


class Capture(Transport):
    """A Sentry transport that keeps the envelopes instead of sending them."""

    envelopes: ClassVar[list[Any]] = []

    def capture_envelope(self, envelope: Any) -> None:
        Capture.envelopes.append(envelope)


CheckInsSent = Callable[[], list[tuple[str, str, str]]]


@pytest.fixture
def checkins_sent(logging_restored: None) -> Iterator[CheckInsSent]:
    """Sentry captures into :class:`Capture`; the fixture gives a function listing the check-ins
    sent so far as ``(monitor slug, status, check-in id)``. Logging is set up as the scheduler's
    (an earlier test may have left structlog printing past the standard library, and Sentry)."""
    configure_logging(load_settings({"LOG_LEVEL": "INFO"}))
    Capture.envelopes.clear()
    client = sentry_sdk.Client(dsn="https://key@o0.ingest.sentry.io/1", transport=Capture)

    def sent() -> list[tuple[str, str, str]]:
        items = [item.payload.json for envelope in Capture.envelopes for item in envelope.items]
        checkins = [i for i in items if i.get("type") == "check_in"]  # not the logged errors
        return [(i["monitor_slug"], i["status"], i["check_in_id"]) for i in checkins]

    with sentry_sdk.isolation_scope() as scope:
        scope.set_client(client)
        yield sent


def error_events() -> list[tuple[str, str]]:
    """The events (not check-ins) Sentry captured, as (logger, level): ERROR lines become events."""
    items = [item.payload.json for envelope in Capture.envelopes for item in envelope.items]
    return [(i.get("logger"), i.get("level")) for i in items if i.get("type") != "check_in"]


class Clock:
    """``datetime`` for ``scheduler.service``, its ``now`` set by the test."""

    moment = utc(2026, 1, 5, 10, 0, 30)

    @classmethod
    def install(cls, monkeypatch: pytest.MonkeyPatch, start: datetime) -> type[datetime]:
        cls.moment = start

        class Now(datetime):
            @classmethod
            def now(cls, tz: Any = None) -> Any:
                return Clock.moment.astimezone(tz)

        monkeypatch.setattr(scheduler.service, "datetime", Now)
        return Now


class RefusingBroker:
    """The system's actors, and an enqueue that fails (RabbitMQ down) while ``refusing``."""

    def __init__(self) -> None:
        self.refusing = True
        self.sent: list[str] = []

    def get_actor(self, name: str) -> Any:
        return get_system().broker.get_actor(name)

    def enqueue(self, message: Any) -> Any:
        if self.refusing:
            raise ConnectionError("connection refused")
        self.sent.append(message.options["fire_time"])
        return message


HOURLY = Schedule(
    id="hourly-purge",
    actor="purge_exports",
    trigger=CronSchedule("0 * * * *"),
    cron="0 * * * *",
    misfire_grace=timedelta(minutes=5),
)


def leading_scheduler(store: Any, broker: RefusingBroker, started_at: datetime) -> Scheduler:
    """A scheduler of ``HOURLY`` that leads, its fires run by the test (APScheduler not started)."""
    sched = Scheduler(
        [HOURLY],
        broker=broker,  # type: ignore[arg-type]
        store=store,
        settings=get_system().settings,
        checkins=CheckIns([HOURLY]),
    )
    sched.started_at = started_at
    assert sched.lease.poll()
    return sched


def fire_every_5s(sched: Scheduler, until: datetime) -> int:
    """Run the schedule's fire as its retries do, every 5 s of the clock up to ``until``."""
    runs = 0
    while Clock.moment <= until:
        sched.fire(HOURLY.id, True)
        Clock.moment += timedelta(seconds=5)
        runs += 1
    return runs


def test_retries_during_an_outage_check_in_once_then_ok_when_sent(store, monkeypatch, checkins_sent):
    """RabbitMQ refuses for 90 s: the 19 attempts of the 10:00 fire open one check-in, and the
    send that works closes it (each retry sent an ``error`` check-in: 19 in 90 s)."""
    Clock.install(monkeypatch, utc(2026, 1, 5, 10, 0, 30))
    broker = RefusingBroker()
    sched = leading_scheduler(store, broker, started_at=utc(2026, 1, 5, 9, 59))
    assert fire_every_5s(sched, until=utc(2026, 1, 5, 10, 2)) == 19
    assert [status for _, status, _ in checkins_sent()] == ["in_progress"]
    assert error_events() == [("scheduler", "error")]  # schedule_send_failed once; its retries warn
    broker.refusing = False
    sched.fire(HOURLY.id, True)
    assert broker.sent == ["2026-01-05T10:00:00Z"]
    checkin = check_in_id(fire_key(HOURLY.id, utc(2026, 1, 5, 10)))
    assert checkins_sent() == [("hourly-purge", "in_progress", checkin), ("hourly-purge", "ok", checkin)]


def test_a_fire_given_up_after_the_grace_checks_in_error_once(store, monkeypatch, checkins_sent):
    """Refused from 10:00:30 until well past the 5-minute grace: the 10:00 fire's check-in is
    closed ``error`` once, when the fire is dropped; the next fire has a check-in of its own."""
    Clock.install(monkeypatch, utc(2026, 1, 5, 10, 0, 30))
    broker = RefusingBroker()
    sched = leading_scheduler(store, broker, started_at=utc(2026, 1, 5, 9, 59))
    fire_every_5s(sched, until=utc(2026, 1, 5, 10, 7))
    broker.refusing = False
    Clock.moment = utc(2026, 1, 5, 11, 0, 1)
    sched.fire(HOURLY.id)
    assert broker.sent == ["2026-01-05T11:00:00Z"]
    ten, eleven = (check_in_id(fire_key(HOURLY.id, utc(2026, 1, 5, h))) for h in (10, 11))
    assert checkins_sent() == [
        ("hourly-purge", "in_progress", ten),
        ("hourly-purge", "error", ten),
        ("hourly-purge", "in_progress", eleven),
        ("hourly-purge", "ok", eleven),
    ]


def test_a_leader_taking_over_closes_the_check_in_the_old_one_opened(checkins_sent):
    """Check-in ids come from the fire: the new leader's ``ok`` closes the old leader's check-in,
    and the old one, seeing the fire recorded as sent, forgets it without an ``error``."""
    fire = utc(2026, 1, 5, 10)
    old, new = CheckIns([HOURLY]), CheckIns([HOURLY])
    old.started(HOURLY, fire, fire_key(HOURLY.id, fire))
    new.started(HOURLY, fire, fire_key(HOURLY.id, fire))
    new.sent(HOURLY, fire)
    old.given_up(HOURLY, last=fire, due=[])
    old.given_up(HOURLY, last=fire, due=[])
    assert len({checkin for _, _, checkin in checkins_sent()}) == 1
    assert [status for _, status, _ in checkins_sent()] == ["in_progress", "in_progress", "ok"]


def test_check_ins_go_to_one_monitor_per_schedule(tmp_path, checkins_sent):
    path = tmp_path / "schedules.toml"
    path.write_text(
        textwrap.dedent(
            """
            [[schedule]]
            id = "Daily.Report"
            actor = "generate_report"
            args = ["sales"]
            cron = "0 9 * * *"
            timezone = "America/New_York"
            misfire_grace = "1h"

            [[schedule]]
            id = "odd"
            actor = "purge_exports"
            every = "90s"
            """
        )
    )
    schedules = load_schedules(path, get_system().broker.actors, max_priority=10)
    assert monitor_config(schedules[1]) is None  # Sentry counts intervals in whole minutes
    checkins = CheckIns(schedules)
    fire = utc(2026, 1, 5, 14)
    for schedule in schedules:
        checkins.started(schedule, fire, fire_key(schedule.id, fire))
        checkins.sent(schedule, fire)
    assert [(slug, status) for slug, status, _ in checkins_sent()] == [
        ("daily-report", "in_progress"),
        ("daily-report", "ok"),
    ]
    (first, *_) = (item.payload.json for envelope in Capture.envelopes for item in envelope.items)
    assert first["type"] == "check_in"
    assert first["monitor_config"] == {
        "schedule": {"type": "crontab", "value": "0 9 * * *"},
        "timezone": "America/New_York",
        "checkin_margin": 60,
        "max_runtime": 61,  # in progress until sent or given up: never timed out before the grace
    }
    assert sentry_checkins(get_system().settings, schedules) is None  # no SENTRY_DSN here


def test_the_two_passes_of_a_repeated_hour_have_a_check_in_each(checkins_sent):
    """01:00 EDT and 01:00 EST (1 November 2026 in New York) are equal as times of one zone: the
    second pass found the first's check-in open, and closing it closed the first's (a fire never
    sent reported ``ok``)."""
    hourly = Schedule(
        id="hourly-ny",
        actor="purge_exports",
        trigger=CronSchedule("0 * * * *", "America/New_York"),
        cron="0 * * * *",
        misfire_grace=timedelta(hours=2),
    )
    checkins = CheckIns([hourly])
    zone = hourly.trigger.timezone
    first, second = (datetime(2026, 11, 1, 1, 0, fold=fold, tzinfo=zone) for fold in (0, 1))
    assert first == second and second - first.astimezone(UTC) == timedelta(hours=1)  # the trap
    checkins.started(hourly, first, fire_key(hourly.id, first))
    checkins.started(hourly, second, fire_key(hourly.id, second))
    checkins.sent(hourly, second)
    checkins.given_up(hourly, last=None, due=[])  # the first, never sent, past its grace
    sent = checkins_sent()
    assert [status for _, status, _ in sent] == ["in_progress", "in_progress", "ok", "error"]
    assert sent[0][2] == sent[3][2] != sent[1][2] == sent[2][2]
