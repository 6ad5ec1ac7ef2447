"""The scheduler without processes: fire times (cron, DST, intervals), the misfire plan, the
schedules file's checks, ``--check``, and Sentry check-ins."""

from __future__ import annotations

import os
import subprocess

from tests import workload  # noqa: F401 - declares the test actors
from tests.support import BIN, ROOT


def run_scheduler(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "python"), "-m", "scheduler", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "LOG_FORMAT": "json"},
    )


def test_check_prints_the_next_fires_and_a_bad_file_stops_the_scheduler(tmp_path):
    checked = run_scheduler("--check")
    assert checked.returncode == 0, checked.stderr
    assert "daily-sales-report: generate_report on reports, cron 0 9 * * * America/New_York" in checked.stdout
    assert "T09:00:00-0" in checked.stdout  # 09:00 New York time, EST or EDT
    bad = tmp_path / "bad.toml"
    bad.write_text('[[schedule]]\nid = "nightly"\nactor = "no_such_actor"\nevery = "1d"\n')
    for args in (("--check", "--schedules", str(bad)), ("--schedules", str(bad))):
        result = run_scheduler(*args)
        assert result.returncode == 2
        assert "schedule 'nightly': unknown actor 'no_such_actor'" in result.stdout + result.stderr
