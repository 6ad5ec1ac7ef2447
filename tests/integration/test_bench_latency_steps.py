"""``python -m bench --only steps`` traces idle probes through real workers of both stacks."""

from __future__ import annotations

import re

from jobsystem.ops.migration import existing_queues
from jobsystem.settings import load_settings
from tests.support import run_bench

SENT = "send hooks (full stack: key registered)"
HANDED = "handed to the consumer thread"
FULL_ONLY = ["delivery read (pika)", "delivery decoded and checked", "receive hooks (claims sent)"]
HOOKS = ["JobLifecycle.before_process_message", "Idempotency.before_process_message"]


Cell = tuple[float | None, float | None, float | None]


def cells(line: str) -> list[Cell]:
    """A row's cells, bare's then the full stack's: (ended, took, CPU), None where not shown."""
    found: list[Cell] = []
    for token in line[54:].split():
        if token.startswith("("):
            took, cpu = token.strip("()").split("/")
            found[-1] = (found[-1][0], float(took), float(cpu))
        else:
            found.append((None if token == "-" else float(token), None, None))
    return found


def test_each_stacks_steps_are_noted_in_the_order_a_probe_takes_them():
    done = run_bench("--only", "steps", "--latency-count", "15", "-p", "1", "-t", "2", timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    prefix = re.search(r"^scratch environment (bench[0-9a-f]{6}\.) ", done.stdout, re.M)[1]  # type: ignore[index]
    assert not [name for name in existing_queues(load_settings()) if name.startswith(prefix)]
    head = next(i for i, line in enumerate(lines) if line.startswith("where an idle probe's"))
    assert "10 probes 100 ms apart" in lines[head]
    rows = {line[:54].strip(): cells(line) for line in lines[head + 2 :]}
    assert list(rows)[-1] == "actor started"
    for step in FULL_ONLY:
        assert rows[step][0] == (None, None, None), step  # bare Dramatiq's consumer has no such steps
    bare = [rows[step][0][0] for step in [SENT, HANDED, "AgeLimit.before_process_message", "actor started"]]
    full = [rows[step][1][0] for step in [SENT, *FULL_ONLY, HANDED, *HOOKS, "actor started"]]
    assert None not in bare and bare == sorted(bare)  # type: ignore[type-var]
    assert None not in full and full == sorted(full)  # type: ignore[type-var]
    # the full stack registers the probe's key (a store round trip) before it publishes
    _, took, cpu = rows[SENT][1]
    assert took is not None and took > 0.05
    # ... and part of that time it waits for the store's reply: its thread's CPU time is less
    assert cpu is not None and 0 < cpu < took
