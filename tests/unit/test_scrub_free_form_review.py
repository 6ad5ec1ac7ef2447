"""Review of free-form values after a key (``address=221B Baker Street``: run on to the value's end).

A run of backslashes after such a value was scanned again from each of its backslashes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]

#: A line the scan read once per backslash (200,000 of them, no quote after): some 450 s here
#: before the fix, milliseconds after it. Cut at 64 KiB by default, such a line took some 50 s.
_BACKSLASHES = """
from jobsystem.privacy.scrub import Scrubber
line = "address=x " + "\\\\" * 200_000 + " status=ok"
print(Scrubber(max_length=300_000).text(line))
"""


def test_a_run_of_backslashes_after_a_free_form_value_is_scanned_once() -> None:
    """The scrub runs in a child process (the regex engine holds the GIL, a thread could not be
    given up on); it must end well within the wait: a hang guard, not a measure of speed."""
    env = {**os.environ, "PYTHONPATH": str(_ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _BACKSLASHES], cwd=_ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == "address=[address] status=ok\n"
