"""``bench.latency_features``: each variant beside the full stack, and its difference from it."""

from __future__ import annotations

from typing import Any

import pytest

import bench.latency_features as features
from bench.latency import Latency, Target
from bench.throughput import Run


class FakeSender:
    def __init__(self, **env: str) -> None:
        self.env, self.closed = env, False

    def close(self) -> None:
        self.closed = True


def test_each_variant_runs_beside_the_full_stack_and_reports_its_median_difference(
    monkeypatch: pytest.MonkeyPatch,
):
    senders: list[FakeSender] = []
    runs: list[list[Target]] = []
    # How much slower than the full stack the variant is in each run: the control, then "no
    # status", in each of three repetitions. Median differences: +0.2 and 0.0 ms.
    slower = iter([0.1, 0.0, 0.3, 0.0, 0.2, 0.0])

    def make_sender(**env: str) -> Any:
        senders.append(FakeSender(**env))
        return senders[-1]

    def interleaved(targets: list[Target], count: int, *args: Any, **env: Any) -> list[Latency]:
        assert count == 5 and env["LOG_LEVEL"] == "INFO"
        runs.append(targets)
        ms = (1.0, 2.0, 2.0 + next(slower))  # bare Dramatiq, the full stack, the variant
        return [Latency(t.label, [m / 1000] * count) for t, m in zip(targets, ms, strict=True)]

    monkeypatch.setattr(features, "interleaved", interleaved)
    monkeypatch.setattr(features, "VARIANTS", {"control": {}, "no status": {"JOB_STATUS": "false"}})
    lines = list(features.report(None, make_sender, Run(10, 2, 8), 3, 5))  # type: ignore[arg-type]

    # The variant's sender and worker both get its settings; the two project workers, ports of their own.
    for bare, full, variant in runs:
        assert (bare.module, full.module, variant.module) == ("bench.bare", "bench.project", "bench.project")
        assert variant.env.get("JOB_STATUS") == variant.broker.env.get("JOB_STATUS")  # type: ignore[attr-defined]
        assert full.env["PROMETHEUS_PORT"] != variant.env["PROMETHEUS_PORT"]
    assert [s.env for s in senders] == [{}] + [{}, {"JOB_STATUS": "false"}] * 3
    assert all(s.closed for s in senders)
    assert "(2.00x)" in lines[1] and lines[1].split()[-1] == "+0.100"
    assert lines[-3] == "  median difference from the full stack"
    assert lines[-2].split() == ["control", "+0.200", "ms"]
    assert lines[-1].split() == ["no", "status", "+0.000", "ms"]
