"""The step table of ``python -m bench --only steps``: ends and durations from the send, by stack."""

from __future__ import annotations

import pytest

from bench.latency_steps import STARTED, Steps, steps_table

SENT = 100.0


def ms(value: float) -> float:
    return SENT + value / 1000


def test_a_step_shows_when_it_ended_and_how_long_it_took_as_medians_over_the_probes():
    steps = Steps("full stack")
    for took, cpu in ((0.2, 0.1), (0.4, 0.4), (0.3, 0.25)):
        steps.add_probe(SENT, [("claims sent", ms(1.0), ms(1.0 + took), cpu / 1000)])
    assert steps.cell("claims sent") == "  1.30 (0.30/0.25)"  # wall / thread CPU: it waited a little


def test_a_wait_that_began_before_the_send_shows_its_end_only():
    steps = Steps("bare")
    steps.add_probe(SENT, [("delivery read (pika)", SENT - 0.2, ms(1.8), 0.0003)])
    assert steps.cell("delivery read (pika)").split() == ["1.80"]


def test_a_step_noted_twice_in_one_probe_counts_its_first_time():
    steps = Steps("full stack")
    steps.add_probe(
        SENT,
        [("delivery read (pika)", ms(1.0), ms(1.5), 0.0), ("delivery read (pika)", ms(2.0), ms(2.1), 0.0)],
    )
    assert steps.ended["delivery read (pika)"] == [pytest.approx(1.5)]


def test_the_table_follows_the_full_stacks_order_a_bare_only_step_after_the_one_it_follows():
    bare, full = Steps("bare"), Steps("full stack")
    bare.add_probe(
        SENT,
        [
            ("handed over", ms(1.0), ms(1.8), 0.0001),
            ("AgeLimit", ms(1.9), ms(1.9), 0.0),
            ("only bare", ms(1.95), ms(1.96), 0.00001),
            (STARTED, ms(2.0), ms(2.0), 0.0),
        ],
    )
    full.add_probe(
        SENT,
        [
            ("registered", ms(0.0), ms(0.5), 0.0002),
            ("handed over", ms(2.0), ms(2.5), 0.0003),
            ("AgeLimit", ms(3.0), ms(3.0), 0.0),
            (STARTED, ms(3.4), ms(3.4), 0.0),
        ],
    )
    rows = [line[:54].strip() for line in steps_table(bare, full)[1:]]
    assert rows == ["registered", "handed over", "AgeLimit", "only bare", STARTED]
    table = "\n".join(steps_table(bare, full))
    assert "bare" in table.splitlines()[0] and "full stack" in table.splitlines()[0]
    registered = next(line for line in steps_table(bare, full) if "registered" in line)
    assert registered.split()[1:] == ["-", "0.50", "(0.50/0.20)"]
