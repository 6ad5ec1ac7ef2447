"""``python -m bench --only latency`` probes real workers of both stacks, idle ones side by side."""

from __future__ import annotations

import re

from jobsystem.ops.migration import existing_queues
from jobsystem.settings import load_settings
from tests.support import run_bench

LABELS = ("bare Dramatiq", "full stack (defaults + key + limit)")


def test_both_paces_give_each_stacks_median_and_p99_and_their_ratio():
    done = run_bench(
        "--only", "latency", "--latency-count", "6", "--repeat", "1", "-p", "1", "-t", "2", timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    prefix = re.search(r"^scratch environment (bench[0-9a-f]{6}\.) ", done.stdout, re.M)[1]  # type: ignore[index]
    assert not [name for name in existing_queues(load_settings()) if name.startswith(prefix)]
    lines = done.stdout.splitlines()
    paces = [i for i, line in enumerate(lines) if re.match(r"  (back to back|idle)", line)]
    assert [lines[i].split(",")[1:] for i in paces] == [
        [" 6 probes", " one worker after the other"],
        [" 4 probes", " both workers running", " probes to each in turn (each worker's 200 ms apart)"],
    ]
    for head in paces:
        figures = lines[head + 1 : head + 4]
        for label, line in zip(LABELS, figures[:2], strict=True):
            found = re.fullmatch(rf"    {re.escape(label)} +median +([\d.]+) ms +p99 +([\d.]+) ms", line)
            assert found is not None, line
            median, p99 = map(float, found.groups())
            assert 0 < median <= p99
        assert figures[2].split()[:4] == ["ratio", "full", "/", "bare"]
        assert float(figures[2].split()[-1]) > 0
