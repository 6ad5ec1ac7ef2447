"""What a dead or live demo leaves, as the sweep tests make it: queues, the delay cascade, state keys
and a folder under a demo prefix of their own, all deleted at the test's end."""

from __future__ import annotations

import os
import secrets
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from demo.alive import alive_queue
from demo.folders import FRESH_S, folder_for, hold_folder, mark_folder, vhost_of
from demo.services import delete_named, listed_names
from jobsystem.rabbitmq.delays import DelayCascade
from jobsystem.settings import Settings
from jobsystem.store.redis import delete_matching

__all__ = ["Made"]

_WORK_QUEUES = ("emails", "emails.DQ", "emails.DLQ")


#: The vhost a demo of this host runs on when it is not this one.
_OTHER_VHOST = "rabbit-2:5672/other"


#: The expiry the sweep gives the state keys it cannot judge.
_A_DAY = 24 * 3600


def _demo_prefix() -> str:
    return f"demo-{uuid.uuid4().hex[:6]}-"


def _old_folder(prefix: str, root: Path, vhost: str) -> Path:
    """A folder as the release before the lock made it: its name without ``-held``, unlocked."""
    tail = "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz0123456789_") for _ in range(8))
    folder = root / f"jobs-{prefix}{tail}"
    folder.mkdir(mode=0o700)
    mark_folder(folder, vhost)
    return folder


def _age(folder: Path) -> None:
    """Date ``folder`` back past :data:`FRESH_S` (an unmarked held folder younger is taken for one
    between its ``mkdir`` and its lock): a demo's killed there, found by a later sweep."""
    past = time.time() - 2 * FRESH_S
    os.utime(folder, (past, past))


class Made:
    """The names a test made, all deleted at its end (the sweep's or not)."""

    def __init__(self, settings: Settings, channel: Any, client: redis.Redis, folders: Path) -> None:
        self.settings, self.channel, self.client = settings, channel, client
        self.folders = folders  # the temporary directory the demos' folders are in
        self.starts: list[str] = []
        self.locks: list[int] = []  # the live demos' folder locks, let go at the end

    def demo(
        self,
        prefix: str,
        *,
        queues: bool = True,
        keys: bool = True,
        vhost: str | None = None,
        owner: str = "gone",
    ) -> Path:
        """A demo's leftovers under ``prefix``: work queues, the delay cascade, two state keys,
        and its folder (returned) with a file in it, marked with ``vhost`` (default: this one).
        The folder's ``owner``: ``gone`` (a killed demo's: its lock free), ``live`` (held by this
        process), ``old`` (the release before the lock: no lock, its old name)."""
        self.starts.append(prefix)
        vhost = vhost or vhost_of(self.settings.rabbitmq_url)
        if owner == "old":
            folder = _old_folder(prefix, self.folders, vhost)
        else:
            folder = folder_for(prefix, self.folders)
            lock = hold_folder(folder, vhost)
            if owner == "live":
                self.locks.append(lock)
            else:
                os.close(lock)
        (folder / "state.db").write_bytes(b"x")
        if queues:
            for name in _WORK_QUEUES:
                self.channel.queue_declare(prefix + name, durable=True)
            DelayCascade(prefix).declare(self.channel)
        if keys:
            self.client.set(f"jobs:{prefix}status:1", "x")
            self.client.set(f"jobs:{prefix}idem:1", "x")
        return folder

    def other(self, name: str) -> None:
        """A queue and a key that are not a demo's, though their names look alike."""
        self.starts.append(name)
        self.channel.queue_declare(name, durable=True)
        self.client.set(f"jobs:{name}", "x")

    def under(self, start: str) -> tuple[list[str], list[str], list[bytes]]:
        """The queues, exchanges and keys under ``start``, sorted (SCAN's order changes as Redis
        rehashes, e.g. after other keys were deleted)."""
        return (
            sorted(listed_names(self.settings, "queues", start)),
            sorted(listed_names(self.settings, "exchanges", start)),
            sorted(self.client.scan_iter(f"jobs:{start}*", count=1000)),
        )

    def delete_all(self) -> None:
        for lock in self.locks:
            os.close(lock)
        for start in self.starts:
            for kind in ("queues", "exchanges"):
                for name in listed_names(self.settings, kind, start):
                    if name != alive_queue(start):  # goes with the test's connection
                        delete_named(self.settings, kind, name)
            delete_matching(self.client, f"jobs:{start}*")
