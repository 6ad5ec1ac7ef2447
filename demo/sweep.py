"""The sweep a demo runs as it starts: what dead demos left behind goes.

A demo killed with SIGKILL leaves its queues (work, ``.DQ``, ``.DLQ``, its delay cascade's), the
cascade's exchanges, its state keys and its temporary folder, and each killed run added more.
Every prefix matching :data:`demo.services.DEMO_PREFIX` found on the vhost is a candidate, and
one found only in a Redis state store if its folder on this host is marked with this vhost (keys
alone may be a live demo's on another vhost sharing the Redis); a candidate is dead when its
alive queue is absent and none of its queues has a consumer, on two looks a few seconds apart
(:func:`demo.alive.dead_prefixes`: a live demo's alive queue is gone too while its connection is
down), and then everything under it is deleted, its folder on this host included
(:mod:`demo.folders`: a folder alone makes no candidate, its demo may use another RabbitMQ).
Demos of the releases before the alive queue have none: theirs are removed as dead once their
worker stopped.

Races: a live demo declares its alive queue before anything else, and the checks come after the
names were listed, so a live demo's names are never taken for a dead one's. Two sweeps removing
the same leftovers at once both succeed (what is already gone is skipped).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import redis

from demo.alive import dead_prefixes
from demo.folders import demo_folders, folder_vhost, remove_folder, vhost_of
from demo.services import DEMO_PREFIX, delete_named, listed_names
from jobsystem.settings import Settings

__all__ = ["Leftovers", "Swept", "find_leftovers", "sweep", "sweep_dead_demos"]

#: What every demo's queue, exchange and (after the state namespace) key starts with.
_DEMO_START = "demo-"


@dataclass
class Leftovers:
    """One demo prefix's queues and exchanges found on the vhost, and its folders on this host."""

    queues: list[str] = field(default_factory=list)
    exchanges: list[str] = field(default_factory=list)
    folders: list[Path] = field(default_factory=list)


@dataclass
class Swept:
    """What a sweep removed: the dead demos' prefixes, and how many of their things."""

    demos: list[str] = field(default_factory=list)
    queues: int = 0
    exchanges: int = 0
    state_keys: int = 0
    folders: int = 0

    @property
    def leftovers(self) -> int:
        return self.queues + self.exchanges + self.state_keys + self.folders

    def line(self) -> str:
        """The one line the demo prints."""
        return (
            f"Removed {self.leftovers} leftovers of {len(self.demos)} dead demo(s): {self.queues} queues, "
            f"{self.exchanges} exchanges, {self.state_keys} state keys, {self.folders} folders"
        )


def _namespace(settings: Settings, prefix: str) -> str:
    """The state store's key prefix of the demo running under ``prefix``."""
    return settings.model_copy(update={"queue_prefix": prefix}).state_namespace


def _redis(settings: Settings) -> redis.Redis | None:
    """A client of the state store when it is Redis (a SQLite store is a file in the dead demo's
    temporary folder, not shared between hosts)."""
    if not settings.state_url.startswith(("redis://", "rediss://")):
        return None
    return redis.Redis.from_url(settings.state_url, socket_timeout=settings.state_timeout)


def find_leftovers(settings: Settings, folders_in: Path | None = None) -> dict[str, Leftovers]:
    """Every demo prefix with queues, exchanges or state keys, whether its demo is alive or not,
    with its folders under ``folders_in`` (default: the temporary directory)."""
    found: dict[str, Leftovers] = {}
    for kind in ("queues", "exchanges"):
        for name in listed_names(settings, kind, _DEMO_START):
            match = DEMO_PREFIX.match(name)
            if match:
                getattr(found.setdefault(match.group(), Leftovers()), kind).append(name)
    client = _redis(settings)
    if client is not None:
        base = _namespace(settings, "")
        try:
            for key in client.scan_iter(f"{_namespace(settings, _DEMO_START)}*", count=1000):
                match = DEMO_PREFIX.match(key.decode(errors="replace")[len(base) :])
                if match:
                    found.setdefault(match.group(), Leftovers())
        finally:
            client.close()
    folders_by_prefix = demo_folders(folders_in)
    for prefix, folders in folders_by_prefix.items():
        if prefix in found:  # a folder alone is no candidate: its demo may use another vhost
            found[prefix].folders = folders
    here = vhost_of(settings.rabbitmq_url)
    return {p: found[p] for p in found if _judged_here(found[p], folders_by_prefix.get(p, []), here)}


def _judged_here(leftovers: Leftovers, folders: list[Path], here: str) -> bool:
    """Whether this vhost can tell if the demo of ``leftovers`` is dead: it has queues or
    exchanges here, or only state keys and a folder on this host marked with this vhost (keys
    alone may be a live demo's on another vhost sharing the Redis)."""
    if leftovers.queues or leftovers.exchanges:
        return True
    return any(folder_vhost(folder) == here for folder in folders)


def _delete(settings: Settings, kind: str, names: list[str], prefix: str) -> int:
    """Delete the ``names`` under ``prefix`` (only those); returns how many were still there."""
    return sum(delete_named(settings, kind, name) for name in names if name.startswith(prefix))


def sweep(settings: Settings, own_prefix: str, found: dict[str, Leftovers]) -> Swept:
    """Delete the ``found`` leftovers of the prefixes whose demo is dead; never ``own_prefix``,
    never a name outside a prefix matching ``DEMO_PREFIX``."""
    from jobsystem.rabbitmq.broker import connection_urls
    from jobsystem.store.redis import delete_matching

    candidates = sorted(p for p in found if p != own_prefix and DEMO_PREFIX.fullmatch(p))
    queues = {prefix: found[prefix].queues for prefix in candidates}
    swept = Swept(demos=dead_prefixes(connection_urls(settings)[0], queues) if candidates else [])
    for prefix in swept.demos:
        swept.queues += _delete(settings, "queues", found[prefix].queues, prefix)
        swept.exchanges += _delete(settings, "exchanges", found[prefix].exchanges, prefix)
        swept.folders += sum(remove_folder(folder, prefix) for folder in found[prefix].folders)
    client = _redis(settings) if swept.demos else None
    if client is not None:
        try:
            for prefix in swept.demos:
                swept.state_keys += delete_matching(client, f"{_namespace(settings, prefix)}*")
        finally:
            client.close()
    return swept


def sweep_dead_demos(settings: Settings, own_prefix: str) -> Swept:
    """Find every demo's leftovers, and delete those of the dead demos (call it once the own
    alive queue is declared: the own prefix is skipped in any case)."""
    return sweep(settings, own_prefix, find_leftovers(settings))
