"""A file written whole or not at all: ``jobctl dlq export -o FILE`` stopped midway leaves no file
that looks complete."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

__all__ = ["written_whole"]


@contextmanager
def written_whole(path: str) -> Iterator[IO[str]]:
    """A text file to write ``path`` through: a temporary file beside the file ``path`` names (a
    symbolic link followed), renamed over it once the block ends, removed if it raises or exits
    instead, so the file is either whole or as it was before. A new file is readable by its owner
    only (as ``mkstemp`` makes it), an existing one keeps its mode. What is no regular file (a
    named pipe, ``/dev/stdout``, bash's ``/dev/fd/N``) is written to directly: a stream has no
    "as before" to keep, and renaming over it would take it from its reader. OSError if the
    folder cannot take it."""
    real = os.path.realpath(path)
    try:
        found: os.stat_result | None = os.stat(real)
    except FileNotFoundError:
        found = None
    if found is not None and not stat.S_ISREG(found.st_mode):
        with open(real, "w", encoding="utf-8") as stream:
            yield stream
        return
    folder, name = os.path.split(real)
    handle = tempfile.NamedTemporaryFile(  # noqa: SIM115 - renamed or removed below, not closed on exit
        "w", encoding="utf-8", dir=folder, prefix=f".{name}.", suffix=".partial", delete=False
    )
    try:
        with handle:
            if found is not None:
                os.fchmod(handle.fileno(), stat.S_IMODE(found.st_mode))
            yield handle
        os.replace(handle.name, real)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(handle.name)
        raise
