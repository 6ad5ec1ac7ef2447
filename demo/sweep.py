"""The sweep a demo runs as it starts: what dead demos left behind goes.

A demo killed with SIGKILL leaves its queues (work, ``.DQ``, ``.DLQ``, its delay cascade's), the
cascade's exchanges, its state keys and its temporary folder, and each killed run added more.
A prefix matching :data:`demo.services.DEMO_PREFIX` is judged on this vhost when it has queues or
exchanges here, or a folder on this host marked with this vhost (keys alone may be a live demo's
on another vhost sharing the Redis). A judged prefix is a candidate unless a folder of it is held
by a live process (:mod:`demo.folders`); a candidate is dead when its alive queue is absent and
none of its queues has a consumer, on two looks a few seconds apart (:func:`demo.alive.dead_prefixes`:
a live demo's alive queue is gone too while its connection is down), and then everything under it
is deleted: its state keys first, its folders last (a sweep stopped halfway, killed or Redis down,
leaves the folder that makes the keys judged here for the next one). Demos of the releases before
the alive queue have none: theirs are removed as dead once their worker stopped.

Whatever RabbitMQ says, a held folder none of whose owners lives goes (its demo is dead, whatever
stage it reached: one killed before declaring its queues left nothing else). State keys the sweep
cannot judge (no queue here, no folder marked here: a demo of another vhost, or one whose folder
went first) are given an expiry of :data:`UNJUDGED_KEYS_TTL_S` if they have none: the per-queue
status counters, the dead-letter index and the worker records have none of their own and stayed
for ever, and no demo runs for a day.

Races: a live demo declares its alive queue before anything else, and the checks come after the
names were listed, so a live demo's names are never taken for a dead one's. Two sweeps removing
the same leftovers at once both succeed (what is already gone is skipped).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import redis

from demo.alive import dead_prefixes
from demo.folders import demo_folders, folder_vhost, is_held, owner_gone, remove_folder, vhost_of
from demo.services import DEMO_PREFIX, delete_named, listed_names
from jobsystem.settings import Settings

__all__ = ["UNJUDGED_KEYS_TTL_S", "Leftovers", "Swept", "find_leftovers", "sweep", "sweep_dead_demos"]

#: What every demo's queue, exchange and (after the state namespace) key starts with.
_DEMO_START = "demo-"

#: The expiry given to demo state keys this vhost cannot judge and that have none: far longer than
#: any demo runs (its timeout is 10 minutes), so a live demo elsewhere keeps them while it runs.
UNJUDGED_KEYS_TTL_S = 24 * 3600


@dataclass
class Leftovers:
    """One demo prefix's queues and exchanges found on the vhost, whether it has state keys, and
    its folders on this host."""

    queues: list[str] = field(default_factory=list)
    exchanges: list[str] = field(default_factory=list)
    folders: list[Path] = field(default_factory=list)
    keys: bool = False


@dataclass
class Swept:
    """What a sweep removed: the dead demos' prefixes, and how many of their things; and how many
    state keys it could not judge were given an expiry."""

    demos: list[str] = field(default_factory=list)
    queues: int = 0
    exchanges: int = 0
    state_keys: int = 0
    folders: int = 0
    keys_expiring: int = 0

    @property
    def leftovers(self) -> int:
        return self.queues + self.exchanges + self.state_keys + self.folders

    def line(self) -> str:
        """The one line the demo prints."""
        removed = (
            f"Removed {self.leftovers} leftovers of {len(self.demos)} dead demo(s): {self.queues} queues, "
            f"{self.exchanges} exchanges, {self.state_keys} state keys, {self.folders} folders"
        )
        expiring = f"{self.keys_expiring} state keys of demos not judged here now expire within a day"
        if not self.keys_expiring:
            return removed
        return f"{removed}; {expiring}" if self.demos else expiring


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
    """Every demo prefix with queues, exchanges, state keys or folders under ``folders_in``
    (default: the temporary directory), whether its demo is alive or not: :func:`sweep` judges."""
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
                    found.setdefault(match.group(), Leftovers()).keys = True
        finally:
            client.close()
    for prefix, folders in demo_folders(folders_in).items():
        found.setdefault(prefix, Leftovers()).folders = folders
    return found


def _judged_here(leftovers: Leftovers, here: str) -> bool:
    """Whether this vhost can tell if the demo of ``leftovers`` is dead: it has queues or
    exchanges here, or a folder on this host marked with this vhost (keys alone may be a live
    demo's on another vhost sharing the Redis, a folder alone one's on another RabbitMQ)."""
    if leftovers.queues or leftovers.exchanges:
        return True
    return any(folder_vhost(folder) == here for folder in leftovers.folders)


def _held_by_the_living(leftovers: Leftovers) -> bool:
    """Whether a held folder of the prefix may have a live owner: its demo runs (or is paused),
    whatever RabbitMQ says."""
    return any(is_held(folder) and not owner_gone(folder) for folder in leftovers.folders)


def _delete(settings: Settings, kind: str, names: list[str], prefix: str) -> int:
    """Delete the ``names`` under ``prefix`` (only those); returns how many were still there."""
    return sum(delete_named(settings, kind, name) for name in names if name.startswith(prefix))


def sweep(settings: Settings, own_prefix: str, found: dict[str, Leftovers]) -> Swept:
    """Delete the ``found`` leftovers of the prefixes whose demo is dead, remove the held folders
    without a live owner, and give an expiry to the state keys this vhost cannot judge; never
    under ``own_prefix``, never outside a prefix matching ``DEMO_PREFIX``."""
    from jobsystem.rabbitmq.broker import connection_urls

    here = vhost_of(settings.rabbitmq_url)
    prefixes = sorted(p for p in found if p != own_prefix and DEMO_PREFIX.fullmatch(p))
    judged = {p for p in prefixes if _judged_here(found[p], here)}
    living = {p for p in prefixes if _held_by_the_living(found[p])}
    candidates = [p for p in prefixes if p in judged and p not in living]
    queues = {prefix: found[prefix].queues for prefix in candidates}
    dead = dead_prefixes(connection_urls(settings)[0], queues) if candidates else []
    swept = Swept()
    client = _redis(settings) if dead or any(found[p].keys for p in prefixes) else None
    try:
        for prefix in prefixes:
            if prefix in dead:
                _delete_dead(settings, client, prefix, found[prefix], swept)
            else:
                expire = prefix not in judged and prefix not in living
                _tidy_not_dead(settings, client, prefix, found[prefix], expire_keys=expire, swept=swept)
    finally:
        if client is not None:
            client.close()
    return swept


def _delete_dead(
    settings: Settings, client: redis.Redis | None, prefix: str, leftovers: Leftovers, swept: Swept
) -> None:
    """Everything under the dead ``prefix``: its keys first, its folders last (see the module's
    docstring)."""
    from jobsystem.store.redis import delete_matching

    if client is not None:
        swept.state_keys += delete_matching(client, f"{_namespace(settings, prefix)}*")
    swept.queues += _delete(settings, "queues", leftovers.queues, prefix)
    swept.exchanges += _delete(settings, "exchanges", leftovers.exchanges, prefix)
    swept.folders += sum(remove_folder(folder, prefix) for folder in leftovers.folders)
    swept.demos.append(prefix)


def _tidy_not_dead(
    settings: Settings,
    client: redis.Redis | None,
    prefix: str,
    leftovers: Leftovers,
    *,
    expire_keys: bool,
    swept: Swept,
) -> None:
    """What a prefix not found dead still has to lose: its held folders without a live owner
    (its demo died, on another vhost or before declaring its queues), and, with ``expire_keys``
    (this vhost cannot judge it, and no folder of it is held), an expiry on its state keys."""
    removed = sum(remove_folder(folder, prefix) for folder in leftovers.folders if is_held(folder))
    if removed:
        swept.folders += removed
        swept.demos.append(prefix)
    if client is not None and leftovers.keys and expire_keys:
        swept.keys_expiring += _expire_unjudged(client, f"{_namespace(settings, prefix)}*")


def _expire_unjudged(client: redis.Redis, pattern: str, batch: int = 1_000) -> int:
    """Give each key matching ``pattern`` without an expiry one of :data:`UNJUDGED_KEYS_TTL_S`
    (``EXPIRE ... NX``: an expiry it has is kept, and a later sweep does not push it back);
    returns how many got one."""
    given = 0
    pipe = client.pipeline(transaction=False)
    for key in client.scan_iter(pattern, count=batch):
        pipe.expire(key, UNJUDGED_KEYS_TTL_S, nx=True)
        if len(pipe) >= batch:
            given += sum(map(bool, pipe.execute()))
    return given + sum(map(bool, pipe.execute()))


def sweep_dead_demos(settings: Settings, own_prefix: str) -> Swept:
    """Find every demo's leftovers, and delete those of the dead demos (call it once the own
    alive queue is declared: the own prefix is skipped in any case)."""
    return sweep(settings, own_prefix, find_leftovers(settings))
