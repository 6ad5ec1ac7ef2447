"""Files the reference actors read and write: paths from messages kept inside a directory.

Paths in messages are data from whoever could send one: an actor resolves each inside the
directory its setting names (symbolic links followed), or refuses it without saying what it was.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["OutsideDirectory", "inside"]


class OutsideDirectory(Exception):
    """A path from a message lies outside the directory its actor may use: retrying would not help."""


def inside(directory: Path, path: str | Path, *, what: str, setting: str) -> Path:
    """``path`` resolved (relative to ``directory`` unless absolute), if it lies inside ``directory``.

    Raises :class:`OutsideDirectory` naming ``what`` and ``setting``, never the path.
    """
    base = directory.resolve()
    try:
        resolved = (base / path).resolve()
    except (OSError, ValueError, RuntimeError):  # a NUL byte; a symbolic link loop (RuntimeError)
        raise OutsideDirectory(f"{what} is not a valid path inside {setting}") from None
    if not resolved.is_relative_to(base):
        raise OutsideDirectory(f"{what} must lie inside {setting}")
    return resolved
