"""A demo's temporary folder: named after its prefix, so that the sweep of a later demo can tell
whose it is.

The folder (``<tmp>/jobs-<prefix><random>``, e.g. ``/tmp/jobs-demo-1a2b3c-k3x9_q0z``) holds the
demo's SQLite state store, reports, uploads, renditions, schedules and child logs. A demo killed
with SIGKILL cannot remove it. The next demo's sweep removes it only with the rest of a prefix
judged dead (:mod:`demo.sweep`): a folder alone proves nothing (a live demo on this host may use
another RabbitMQ), so it never makes its prefix a candidate. The demo creates it once its alive
queue is declared, like everything else under its prefix, and writes in it which RabbitMQ vhost
it runs on (:func:`mark_folder`): a prefix that left only state keys here (a Redis shared by demos
on other vhosts) is judged by that mark, never taken for dead on this vhost's word alone. Folders
of releases before this naming (``jobs-demo-`` and eight random characters) match no prefix and
are left alone.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import stat
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlsplit

__all__ = [
    "FOLDER_NAME",
    "demo_folders",
    "folder_for",
    "folder_vhost",
    "mark_folder",
    "remove_folder",
    "vhost_of",
]

#: A demo folder's name: ``jobs-``, the demo's prefix, then 8 random characters (as ``mkdtemp``).
FOLDER_NAME = re.compile(r"jobs-(demo-[0-9a-f]{6}-)[a-z0-9_]{8}")

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
    """A new folder name for the demo of ``prefix`` under ``root`` (the temporary directory);
    not created: :meth:`Path.mkdir` with ``mode=0o700`` does, once the alive queue is held."""
    tail = "".join(secrets.choice(_RANDOM) for _ in range(8))
    return Path(root or tempfile.gettempdir()) / f"jobs-{prefix}{tail}"


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
    """Remove the demo folder ``path`` of ``prefix`` (refused for any other name); False if it was
    already gone (two sweeps at once) or could not be removed."""
    match = FOLDER_NAME.fullmatch(path.name)
    if match is None or match.group(1) != prefix:
        raise ValueError("refusing to remove a folder that is not this demo prefix's")
    if not path.is_dir() or path.is_symlink():
        return False
    shutil.rmtree(path, ignore_errors=True)
    return not path.exists()
