"""Files the reference actors read and write: paths from messages kept inside a directory, and
outputs written through a temporary file of their own.

Paths in messages are data from whoever could send one: an actor resolves each inside the
directory its setting names (symbolic links followed), or refuses it without saying what it was.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

__all__ = ["PARTIAL_SUFFIX", "OutsideDirectory", "inside", "replacing"]

#: The suffix of a file being written (:func:`replacing`); a purge removes stale ones.
PARTIAL_SUFFIX = ".partial"


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


@contextlib.contextmanager
def replacing(path: Path, mode: str = "xb", **options: Any) -> Iterator[IO[Any]]:
    """A new file beside ``path`` that replaces it when the block ends, removed if the block raises:
    a reader never sees a half-written file, and concurrent writers never share one.

    ``mode`` is ``xb`` or ``x`` (text; ``options`` go to :func:`open`). Its name is random and
    the file created exclusively, as ``tempfile`` does, but with the process's umask: the output
    keeps the permissions it would have had (``mkstemp`` makes 0600).
    """
    partial = path.with_name(f"{path.stem}.{uuid.uuid4().hex}{PARTIAL_SUFFIX}")
    handle = open(partial, mode, **options)  # noqa: SIM115 - closed below
    try:
        with handle:
            yield handle
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
