"""``python -m bench --only latency-features`` probes real workers: bare Dramatiq, the full stack and
the full stack with each feature off, side by side, and leaves no queue behind."""

from __future__ import annotations

import re

from bench.latency_features import VARIANTS
from jobsystem.ops.migration import existing_queues
from jobsystem.settings import load_settings
from tests.support import run_bench


def test_each_variant_gives_three_medians_and_its_difference_from_the_full_stack():
    arguments = ("--only", "latency-features", "--latency-count", "3", "--repeat", "1", "-p", "1", "-t", "2")
    done = run_bench(*arguments, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    prefix = re.search(r"^scratch environment (bench[0-9a-f]{6}\.) ", done.stdout, re.M)[1]  # type: ignore[index]
    assert not [name for name in existing_queues(load_settings()) if name.startswith(prefix)]
    runs = [line for line in done.stdout.splitlines() if line.startswith("  [1/1] ")]
    assert len(runs) == len(VARIANTS)
    for name, line in zip(VARIANTS, runs, strict=True):
        found = re.fullmatch(
            rf"  \[1/1\] {re.escape(name)} +bare +([\d.]+) +full +([\d.]+) \(([\d.]+)x\)"
            r" +variant +([\d.]+) +difference ([+-][\d.]+)",
            line,
        )
        assert found is not None, line
        bare, full, _, variant, difference = map(float, found.groups())
        # The medians are printed to 0.01 ms, the difference to 0.001.
        assert min(bare, full, variant) > 0 and abs(variant - full - difference) <= 0.011
    medians = done.stdout.split("  median difference from the full stack\n")[1].splitlines()[: len(VARIANTS)]
    for name, line in zip(VARIANTS, medians, strict=True):
        assert re.fullmatch(rf"    {re.escape(name)} +[+-][\d.]+ ms", line), line
