"""A file written whole or not at all: ``jobctl dlq export -o FILE`` stopped midway leaves no file
that looks complete."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

__all__ = ["written_whole"]


@contextmanager
def written_whole(path: str) -> Iterator[IO[str]]:
    """A text file to write ``path`` through: a temporary file beside it (readable by its owner
    only, as ``mkstemp`` makes it), renamed to ``path`` once the block ends, removed if it raises
    or exits instead, so ``path`` is either whole or as it was before. OSError if the folder
    cannot take it."""
    folder, name = os.path.split(os.path.abspath(path))
    handle = tempfile.NamedTemporaryFile(  # noqa: SIM115 - renamed or removed below, not closed on exit
        "w", encoding="utf-8", dir=folder, prefix=f".{name}.", suffix=".partial", delete=False
    )
    try:
        with handle:
            yield handle
        os.replace(handle.name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(handle.name)
        raise
