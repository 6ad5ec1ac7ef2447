"""``bench.latency``: probes to several workers in turn, and the lines the bench prints of them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

import bench.latency as latency
from bench.latency import Latency, Target, interleaved


class FakeWorker:
    """Notes each probe it is sent, in one list shared by every worker."""

    def __init__(self, target: Target, sent: list[tuple[str, bool]]) -> None:
        self.target, self.sent = target, sent
        self.delays: list[float] = []

    def probe(self, counted: bool) -> None:
        self.sent.append((self.target.label, counted))
        if counted:
            self.delays.append(0.001 * len(self.sent))


def fake_workers(sent: list[tuple[str, bool]]) -> Any:
    @contextlib.contextmanager
    def workers(targets: list[Target], *args: Any) -> Iterator[list[FakeWorker]]:
        yield [FakeWorker(target, sent) for target in targets]

    return workers


def test_the_workers_take_the_probes_in_turn_always_in_the_same_order(monkeypatch: pytest.MonkeyPatch):
    sent: list[tuple[str, bool]] = []
    monkeypatch.setattr(latency, "_workers", fake_workers(sent))
    monkeypatch.setattr(latency, "WARM_UP", 2)
    targets = [Target(label, "bench.bare", None) for label in "abc"]  # type: ignore[arg-type]
    found = interleaved(targets, 4, 1, 1)
    assert "".join(label for label, _ in sent) == "abc" * 6
    assert [counted for _, counted in sent] == [False] * 6 + [True] * 12  # the warm-up is not counted
    assert [(f.label, len(f.delays)) for f in found] == [("a", 4), ("b", 4), ("c", 4)]


def test_the_lines_give_each_stacks_medians_over_the_runs_and_their_ratio():
    runs = [
        Latency("bare Dramatiq", [0.001, 0.002, 0.003]),
        Latency("full stack", [0.003, 0.004, 0.005]),
        Latency("bare Dramatiq", [0.002, 0.002, 0.002]),
        Latency("full stack", [0.003, 0.003, 0.003]),
    ]
    lines = list(latency._medians(runs))
    assert lines[0].split() == ["bare", "Dramatiq", "median", "2.00", "ms", "p99", "2.50", "ms"]
    assert lines[1].split() == ["full", "stack", "median", "3.50", "ms", "p99", "4.00", "ms"]
    assert lines[2].split()[-1] == "1.75"
