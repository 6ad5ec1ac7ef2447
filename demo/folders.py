"""A demo's temporary folder: named after its prefix, so that the sweep of a later demo can tell
whose it is, and held locked by its demo, so that the sweep can tell whether that demo still runs.

The folder (``<tmp>/jobs-<prefix><random>-held``, e.g. ``/tmp/jobs-demo-1a2b3c-k3x9_q0z-held``)
holds the demo's SQLite state store, reports, uploads, renditions, schedules and child logs. A
demo killed with SIGKILL cannot remove it. The demo creates it once its alive queue is declared
and holds an exclusive ``flock`` on it for its whole run, its worker and scheduler too (they
inherit the descriptor): the kernel lets the lock go when the last of them ends, however it ends.
A held folder whose lock is free has no live owner: the next demo's sweep removes it whatever
stage its demo reached (:func:`remove_folder`), also one killed before its queues were declared,
which left nothing else (its alive queue went with its connection) and whose folder stayed for
ever. The demo marks it (below) once the lock is held: an unmarked held folder younger than
:data:`FRESH_S` is taken for live, it may be in the instant between its ``mkdir`` and its lock.

The demo also writes in it which RabbitMQ vhost it runs on (:func:`mark_folder`): a prefix that
left only state keys here (a Redis shared by demos on other vhosts) is judged by that mark, never
taken for dead on this vhost's word alone. Folders of the release before the lock (the same name
without ``-held``) go only with the rest of a prefix judged dead (:mod:`demo.sweep`); those of
releases before the prefix in the name (``jobs-demo-`` and eight random characters) match no
prefix and are left alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

__all__ = [
    "FOLDER_NAME",
    "FRESH_S",
    "HELD_SUFFIX",
    "demo_folders",
    "folder_for",
    "folder_vhost",
    "hold_folder",
    "is_held",
    "mark_folder",
    "owner_gone",
    "remove_folder",
    "vhost_of",
]

#: A demo folder's name: ``jobs-``, the demo's prefix, 8 random characters (as ``mkdtemp``), then
#: :data:`HELD_SUFFIX` for a folder its demo holds locked (the release before the lock: none).
FOLDER_NAME = re.compile(r"jobs-(demo-[0-9a-f]{6}-)[a-z0-9_]{8}(-held)?")

#: The end of a held folder's name (:func:`hold_folder`).
HELD_SUFFIX = "-held"

#: A held folder without its vhost mark (written once the lock is held) modified this recently is
#: taken for live: its demo may be between its ``mkdir`` and its lock (microseconds; a minute
#: leaves room for a machine under load).
FRESH_S = 60.0

_RANDOM = "abcdefghijklmnopqrstuvwxyz0123456789_"

#: The file in a demo's folder naming the vhost it runs on (:func:`vhost_of`).
_VHOST_MARK = "rabbitmq-vhost"


def vhost_of(rabbitmq_url: str) -> str:
    """``host:port/vhost`` of the first node of ``rabbitmq_url`` (no credentials: the mark is a
    file in a shared temporary directory)."""
    node = urlsplit(rabbitmq_url.split(";")[0])
    return f"{node.hostname or ''}:{node.port or 5672}/{unquote(node.path[1:]) or '/'}"


def mark_folder(path: Path, vhost: str) -> None:
    """Write in the demo folder ``path`` the vhost its demo runs on (:func:`vhost_of`)."""
    (path / _VHOST_MARK).write_text(vhost, encoding="utf-8")


def folder_vhost(path: Path) -> str | None:
    """The vhost marked in the demo folder ``path``; None without a readable mark."""
    try:
        return (path / _VHOST_MARK).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def folder_for(prefix: str, root: Path | None = None) -> Path:
    """A new held folder's name for the demo of ``prefix`` under ``root`` (the temporary
    directory); not created: :func:`hold_folder` does, once the alive queue is held."""
    tail = "".join(secrets.choice(_RANDOM) for _ in range(8))
    return Path(root or tempfile.gettempdir()) / f"jobs-{prefix}{tail}{HELD_SUFFIX}"


def hold_folder(path: Path, vhost: str) -> int:
    """Create the demo folder ``path`` (mode 0700), lock it and mark it with ``vhost``; returns
    the descriptor that holds the lock. Keep it open for the whole run and hand it to the demo's
    children (each copy holds the lock): the folder is then taken for dead only once every one of
    them ended. No lock (a filesystem without ``flock``) raises: an unheld folder would be taken
    for a dead demo's and removed under the running one."""
    path.mkdir(mode=0o700)
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)  # a sweep's probe holds it for an instant at most
        mark_folder(path, vhost)
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def is_held(path: Path) -> bool:
    """Whether ``path`` is named as a held folder (made by :func:`hold_folder`)."""
    match = FOLDER_NAME.fullmatch(path.name)
    return match is not None and match.group(2) is not None


@contextlib.contextmanager
def _lock_if_abandoned(path: Path) -> Iterator[bool]:
    """Whether the held folder ``path`` has no live owner, with its lock held by this process
    for the block when so (another sweep then takes it for live). False when it is unmarked and
    fresh, when its lock is held, when it cannot be opened (gone, a link) or locked (no
    ``flock`` here)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        descriptor = -1
    try:
        yield descriptor >= 0 and _take_lock(descriptor)
    finally:
        if descriptor >= 0:
            os.close(descriptor)  # lets the lock go


def _take_lock(descriptor: int) -> bool:
    if not _marked(descriptor) and time.time() - os.fstat(descriptor).st_mtime < FRESH_S:
        return False
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # BlockingIOError: held by a live demo or its child
        return False
    return True


def _marked(descriptor: int) -> bool:
    """Whether the folder open as ``descriptor`` has its vhost mark: its lock was taken before."""
    try:
        os.stat(_VHOST_MARK, dir_fd=descriptor, follow_symlinks=False)
    except OSError:
        return False
    return True


def owner_gone(path: Path) -> bool:
    """Whether ``path`` is a held folder none of whose owners lives (its lock free; unmarked, older
    than :data:`FRESH_S`): its demo is dead, whatever stage it reached."""
    if not is_held(path):
        return False
    with _lock_if_abandoned(path) as abandoned:
        return abandoned


def demo_folders(root: Path | None = None) -> dict[str, list[Path]]:
    """The demo folders under ``root`` (default: the temporary directory) by prefix: only
    directories (not links) of this user whose name is :data:`FOLDER_NAME`."""
    found: dict[str, list[Path]] = {}
    base = Path(root or tempfile.gettempdir())
    try:
        entries = list(os.scandir(base))
    except OSError:
        return found
    for entry in entries:
        match = FOLDER_NAME.fullmatch(entry.name)
        if match is None or not _own_directory(entry):
            continue
        found.setdefault(match.group(1), []).append(base / entry.name)
    return found


def _own_directory(entry: os.DirEntry[str]) -> bool:
    try:
        info = entry.stat(follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()


def remove_folder(path: Path, prefix: str) -> bool:
    """Remove the demo folder ``path`` of ``prefix`` (refused for any other name): a held one only
    while this process holds its lock, so only once none of its owners lives. False if it was
    already gone (two sweeps at once), is held, or could not be removed."""
    match = FOLDER_NAME.fullmatch(path.name)
    if match is None or match.group(1) != prefix:
        raise ValueError("refusing to remove a folder that is not this demo prefix's")
    if not path.is_dir() or path.is_symlink():
        return False
    if not is_held(path):  # the release before the lock's: its prefix was judged dead
        return _remove(path)
    with _lock_if_abandoned(path) as abandoned:
        return abandoned and _remove(path)


def _remove(path: Path) -> bool:
    shutil.rmtree(path, ignore_errors=True)
    return not path.exists()
