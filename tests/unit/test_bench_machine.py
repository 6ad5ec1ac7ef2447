"""How busy the machine was over a bench window: the shares of its CPU time left idle and stolen
by the hypervisor, from ``/proc/stat``, and the cost table's columns for them."""

from __future__ import annotations

import time

import pytest

from bench.costs import CostTable, rows
from bench.throughput import MachineTimes, Rate, machine_times

# cpu  user nice system idle iowait irq softirq steal guest guest_nice
BEFORE = "cpu  1000 10 200 5000 40 0 30 20 7 0"
AFTER = "cpu  1600 10 300 5300 60 0 40 90 9 0"


def test_a_window_gives_the_shares_of_idle_and_stolen_time():
    window = MachineTimes.parse(AFTER) - MachineTimes.parse(BEFORE)
    # user 600 + system 100 + idle 300 + iowait 20 + softirq 10 + steal 70; guest is within user
    assert window == MachineTimes(idle=320, steal=70, total=1100)
    assert window.idle_share == pytest.approx(320 / 1100)
    assert window.steal_share == pytest.approx(70 / 1100)


def test_a_line_with_fewer_fields_counts_what_it_has():
    assert MachineTimes.parse("cpu 100 0 50 800 0 0 0") == MachineTimes(idle=800, steal=0, total=950)


def test_an_empty_window_gives_no_shares():
    empty = MachineTimes(0, 0, 0)
    assert (empty.idle_share, empty.steal_share) == (0.0, 0.0)


def test_the_machine_clock_advances_and_the_shares_are_fractions():
    start = machine_times()
    deadline = time.monotonic() + 0.1
    while time.monotonic() < deadline:  # keep a core busy for ten clock ticks
        pass
    window = machine_times() - start
    assert window.total > 0
    assert 0.0 <= window.idle_share < 1.0  # this core was busy for the whole window
    assert 0.0 <= window.steal_share <= 1.0


def test_the_cost_table_shows_the_median_idle_and_stolen_shares_of_each_row():
    table = CostTable()
    for idle, steal in ((0.10, 0.00), (0.30, 0.02), (0.20, 0.01)):
        for row in rows():
            rate = Rate(row.label, 1000, 1.0, 0.2, 0.05, 0.0, idle, steal)
            table.add(rate, rate, rate)
    header, *lines = table.lines()
    assert header.split()[-2:] == ["idle", "steal"]
    assert [line.split()[-2:] for line in lines[: len(rows())]] == [["20%", "1%"]] * len(rows())
