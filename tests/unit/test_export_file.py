"""`jobctl dlq export -o FILE` through :func:`written_whole` (review 4 of ``fix/dlq3`` found two faults).

The export now writes a temporary file beside ``FILE`` and renames it over ``FILE``. A rename
replaces the directory entry, whatever it was: a symbolic link (``latest.jsonl`` pointing at the
dated export, a path into a mounted audit folder) becomes a regular file and the file it pointed
at keeps its old contents; a named pipe (``-o >(gzip > x.gz)`` in bash is ``/dev/fd/63``, a FIFO
a collector reads) is replaced by a file no reader ever opens. Before the merge ``click.File("w")``
wrote through both. Both were strict xfails; now a link is followed and what is no regular file
is written to directly.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from jobctl.whole_file import written_whole


def test_a_regular_file_is_replaced_whole(tmp_path: Path) -> None:
    """The control: an earlier export is replaced, and no temporary file is left beside it."""
    target = tmp_path / "dead.jsonl"
    target.write_text("old\n")
    with written_whole(str(target)) as out:
        out.write("new\n")
    assert target.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dead.jsonl"]


def test_an_existing_export_keeps_its_mode_and_a_new_one_is_its_owners_only(tmp_path: Path) -> None:
    shared = tmp_path / "shared.jsonl"
    shared.write_text("old\n")
    shared.chmod(0o640)
    with written_whole(str(shared)) as out:
        out.write("new\n")
    assert stat.S_IMODE(shared.stat().st_mode) == 0o640
    fresh = tmp_path / "fresh.jsonl"
    with written_whole(str(fresh)) as out:
        out.write("new\n")
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o600


def test_an_export_through_a_symbolic_link_writes_the_file_it_points_at(tmp_path: Path) -> None:
    real = tmp_path / "audit" / "dead-2026-12-05.jsonl"
    real.parent.mkdir()
    real.write_text("old\n")
    link = tmp_path / "latest.jsonl"
    link.symlink_to(real)
    with written_whole(str(link)) as out:
        out.write("new\n")
    assert link.is_symlink(), "the link was replaced by a regular file"
    assert real.read_text() == "new\n"


def test_an_export_into_a_named_pipe_reaches_its_reader(tmp_path: Path) -> None:
    pipe = tmp_path / "collector.fifo"
    os.mkfifo(pipe)
    reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)  # the collector, already listening
    try:
        with written_whole(str(pipe)) as out:
            out.write("new\n")
        assert stat.S_ISFIFO(pipe.lstat().st_mode), "the pipe was replaced by a regular file"
        assert os.read(reader, 100) == b"new\n"
    finally:
        os.close(reader)
