"""The schedules file (TOML): read, check every entry against the actors, and build the triggers.

Any problem stops the scheduler at start with every bad entry named: an unknown actor, key, time
zone or queue, a bad cron expression (or one that never fires, ``0 0 30 2 *``), a duration that is
not above zero and at most ten years, ``cron`` and ``every`` together, a missing or repeated
``id``, args that the actor's signature does not accept, or a file that is not UTF-8 TOML.
"""

from __future__ import annotations

import inspect
import json
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import dramatiq
from apscheduler.triggers.base import BaseTrigger

from scheduler.triggers import (
    CronSchedule,
    format_duration,
    interval_trigger,
    parse_duration,
    seconds_duration,
    zone,
)

#: The schedules shipped with the project (``SCHEDULES_FILE`` or ``--schedules`` name another).
DEFAULT_FILE = Path(__file__).with_name("schedules.toml")
#: How late a missed fire may still be sent when an entry does not say (``misfire_grace``).
DEFAULT_MISFIRE_GRACE = timedelta(minutes=5)

_KEYS = {
    "id",
    "actor",
    "args",
    "kwargs",
    "cron",
    "timezone",
    "every",
    "queue",
    "priority",
    "misfire_grace",
    "enabled",
}
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_QUEUE = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")


class ScheduleError(ValueError):
    """The schedules file is invalid; ``problems`` lists each, naming its entry."""

    def __init__(self, path: Path, problems: list[str]) -> None:
        super().__init__(f"invalid schedules in {path}:\n  " + "\n  ".join(problems))
        self.path = path
        self.problems = problems


@dataclass(frozen=True)
class Schedule:
    """One entry of the schedules file, checked."""

    id: str
    actor: str
    trigger: BaseTrigger
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    cron: str | None = None
    timezone: str = "UTC"
    every: timedelta | None = None
    #: The queue to send to instead of the actor's, without ``QUEUE_PREFIX``.
    queue: str | None = None
    priority: int | None = None
    misfire_grace: timedelta = DEFAULT_MISFIRE_GRACE
    enabled: bool = True

    @property
    def spec(self) -> str:
        """How the entry fires, for logs: ``cron 0 9 * * * America/New_York`` or ``every 15m``."""
        if self.cron is not None:
            return f"cron {self.cron} {self.timezone}"
        assert self.every is not None
        return f"every {format_duration(self.every)}"


def _duration(value: object) -> timedelta:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError("must be a duration such as 30s, 5m, 1h, or a number of seconds")
    return seconds_duration(value) if isinstance(value, int) else parse_duration(value)


def _check_json(name: str, value: object) -> None:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"{name} must hold JSON values only (strings, numbers, booleans, arrays, tables)"
        ) from None


def _checked_actor(
    raw: Mapping[str, Any], actors: Mapping[str, dramatiq.Actor[Any, Any]], problems: list[str]
) -> str | None:
    """The entry's actor name when it names a known actor; its args and kwargs fit its signature."""
    actor_name = raw.get("actor")
    if actor_name is None:
        problems.append("missing actor")
    elif not isinstance(actor_name, str) or actor_name not in actors:
        problems.append(f"unknown actor {actor_name!r}")
    args, kwargs = raw.get("args", []), raw.get("kwargs", {})
    if "args" in raw and not isinstance(args, list):
        problems.append("args must be an array")
    if "kwargs" in raw and not isinstance(kwargs, dict):
        problems.append("kwargs must be a table")
    for name, value in (("args", args), ("kwargs", kwargs)):
        try:
            _check_json(name, value)
        except ValueError as exc:
            problems.append(str(exc))
    actor = actors.get(actor_name) if isinstance(actor_name, str) else None
    if actor is not None and isinstance(args, list) and isinstance(kwargs, dict):
        try:
            inspect.signature(actor.fn).bind(*args, **kwargs)
        except TypeError as exc:
            problems.append(f"args/kwargs do not fit {actor_name}(): {exc}")
    return actor_name if isinstance(actor_name, str) else None


def _check_options(raw: Mapping[str, Any], max_priority: int, problems: list[str]) -> timedelta:
    """Check queue, priority, enabled and misfire_grace; returns the misfire grace."""

    def check(name: str, test: bool, message: str) -> None:
        if name in raw and not test:
            problems.append(f"{name} {message}")

    queue, priority = raw.get("queue"), raw.get("priority")
    check("queue", isinstance(queue, str) and bool(_QUEUE.match(queue)), "must be a queue name")
    check(
        "priority",
        isinstance(priority, int) and not isinstance(priority, bool) and 0 <= priority <= max_priority,
        f"must be an integer from 0 to {max_priority} (RABBITMQ_MAX_PRIORITY)",
    )
    check("enabled", isinstance(raw.get("enabled"), bool), "must be true or false")
    if "misfire_grace" in raw:
        try:
            return _duration(raw["misfire_grace"])
        except ValueError as exc:
            problems.append(f"misfire_grace {exc}")
    return DEFAULT_MISFIRE_GRACE


def _trigger(raw: Mapping[str, Any], problems: list[str]) -> tuple[BaseTrigger | None, timedelta | None]:
    """The entry's trigger (from ``cron`` and ``timezone``, or ``every``) and its interval."""
    cron, every, timezone = raw.get("cron"), raw.get("every"), raw.get("timezone", "UTC")
    if cron is not None and every is not None:
        problems.append("has both cron and every; give one")
    elif cron is None and every is None:
        problems.append("needs cron or every")
    elif every is not None:
        if "timezone" in raw:
            problems.append("timezone applies to cron only (every counts in UTC)")
        try:
            interval = _duration(every)
            return interval_trigger(interval), interval
        except ValueError as exc:
            problems.append(f"every {exc}")
    elif not isinstance(cron, str):
        problems.append("cron must be a string such as '0 9 * * *'")
    elif not isinstance(timezone, str):
        problems.append("timezone must be an IANA time zone name such as Europe/Paris")
    else:
        try:
            zone(timezone)
        except ValueError as exc:
            problems.append(f"timezone: {exc}")
            return None, None
        try:
            return CronSchedule(cron, timezone), None
        except ValueError as exc:
            problems.append(f"bad cron expression {cron!r}: {exc}")
    return None, None


def _entry(
    raw: Mapping[str, Any], actors: Mapping[str, dramatiq.Actor[Any, Any]], max_priority: int
) -> Schedule:
    """One entry as a :class:`Schedule`; ValueError says what is wrong with it."""
    problems: list[str] = []
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        problems.append(f"unknown key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}")
    actor_name = _checked_actor(raw, actors, problems)
    grace = _check_options(raw, max_priority, problems)
    trigger, interval = _trigger(raw, problems)
    if problems:
        raise ValueError("; ".join(problems))
    assert trigger is not None and actor_name is not None
    cron = raw.get("cron")
    return Schedule(
        id=str(raw.get("id")),
        actor=actor_name,
        trigger=trigger,
        args=tuple(raw.get("args", [])),
        kwargs=dict(raw.get("kwargs", {})),
        cron=cron,
        timezone=raw.get("timezone", "UTC") if cron is not None else "UTC",
        every=interval,
        queue=raw.get("queue"),
        priority=raw.get("priority"),
        misfire_grace=grace,
        enabled=raw.get("enabled", True),
    )


def parse_schedules(
    document: Mapping[str, Any],
    actors: Mapping[str, dramatiq.Actor[Any, Any]],
    *,
    path: Path,
    max_priority: int = 255,
) -> list[Schedule]:
    """The ``[[schedule]]`` entries of a parsed TOML document; :class:`ScheduleError` lists every problem."""
    problems: list[str] = []
    unknown = sorted(set(document) - {"schedule"})
    if unknown:
        problems.append(f"unknown top-level key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}")
    entries = document.get("schedule", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ScheduleError(path, [*problems, "schedules must be [[schedule]] tables"])
    schedules: list[Schedule] = []
    seen: set[str] = set()
    for number, raw in enumerate(entries, start=1):
        entry_id = raw.get("id")
        valid_id = isinstance(entry_id, str) and bool(_ID.match(entry_id))
        name = f"schedule {entry_id!r}" if valid_id else f"schedule #{number}"
        if entry_id is None:
            problems.append(f"{name}: missing id")
        elif not valid_id:
            problems.append(f"{name}: id must be 1-64 letters, digits, '_', '.' or '-'")
        elif entry_id in seen:
            problems.append(f"{name}: duplicate id")
        if valid_id:
            seen.add(str(entry_id))
        try:
            schedule = _entry(raw, actors, max_priority)
        except ValueError as exc:
            problems.append(f"{name}: {exc}")
            continue
        schedules.append(schedule)
    if problems:
        raise ScheduleError(path, problems)
    return schedules


def load_schedules(
    path: Path, actors: Mapping[str, dramatiq.Actor[Any, Any]], *, max_priority: int = 255
) -> list[Schedule]:
    """Read and check the schedules file at ``path`` (UTF-8, as TOML requires)."""
    try:
        document = tomllib.loads(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise ScheduleError(path, [f"cannot read it: {exc.strerror or exc}"]) from None
    except UnicodeDecodeError as exc:
        raise ScheduleError(path, [f"not UTF-8 text (invalid byte at offset {exc.start})"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ScheduleError(path, [f"not valid TOML: {exc}"]) from None
    return parse_schedules(document, actors, path=path, max_priority=max_priority)
