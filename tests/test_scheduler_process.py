"""``python -m scheduler`` starts and stops cleanly on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess

from tests.support import BIN, ROOT, wait_for


def test_scheduler_starts_and_stops_on_sigterm(tmp_path):
    log = tmp_path / "scheduler.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(BIN / "python"), "-m", "scheduler"],
            cwd=ROOT,
            env={**os.environ, "LOG_FORMAT": "json"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        wait_for(lambda: "scheduler_started" in log.read_text(), what="scheduler start")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    assert "scheduler_stopping" in log.read_text()
