"""``python -m bench --profile ROW`` samples a real worker group under py-spy and summarizes it."""

from __future__ import annotations

import re

from bench.throughput import ROOT
from tests.support import run_bench

ROW = "project, everything off"
RAW = ROOT / "var" / "profile-project-everything-off.txt"


def test_a_rows_worker_group_is_sampled_across_its_processes_and_threads():
    RAW.unlink(missing_ok=True)
    try:
        done = run_bench(
            "--profile", ROW, "--profile-seconds", "2", "-n", "4000", "-p", "2", "-t", "2", timeout=240
        )
        assert done.returncode == 0, done.stderr[-3000:]
        out = done.stdout
        assert f"raw samples in {RAW}" in out
        samples = int(re.search(r"([\d,]+) samples; by thread", out)[1].replace(",", ""))  # type: ignore[index]
        assert samples > 50
        # both kinds of Dramatiq thread, in the worker processes (not only the parent), were seen
        assert re.search(r"%  WorkerThread\.run$", out, re.M)
        assert re.search(r"%  ConsumerThread\.run$", out, re.M)
        assert re.search(r"%  \S+ \(jobsystem/rabbitmq/consumer\.py\)$", out, re.M)
        assert RAW.read_text().count("dramatiq bench.project") > 0
    finally:
        RAW.unlink(missing_ok=True)


def test_a_label_that_names_no_single_row_is_refused_with_the_rows():
    done = run_bench("--profile", "no such row", timeout=120)
    assert done.returncode != 0
    assert "names 0 rows; one of: bare Dramatiq, default middleware;" in done.stderr
