"""The profile's summary of py-spy's raw samples: shares by thread, inclusive and self."""

from __future__ import annotations

import pytest

from bench.profile import summarize
from bench.throughput import ROOT as ROOT_DIR

ROOT = "Thread._bootstrap (threading.py:1002);Thread._bootstrap_inner (threading.py:1045)"
PROCESS = 'process 41:"/venv/bin/python3 /venv/bin/dramatiq bench.project -p 2 -t 8"'
WORKER = "WorkerThread.run (/venv/lib/python3.11/site-packages/dramatiq/worker.py:{})"
CONSUMER = "ConsumerThread.run (/venv/lib/python3.11/site-packages/dramatiq/worker.py:288)"
HOOK = f"Status._update ({ROOT_DIR}/middleware/status.py:{{}})"
POLL = "PollPoller.poll (/venv/lib/python3.11/site-packages/pika/adapters/select_connection.py:1)"


def stack(*frames: str, count: int) -> str:
    return ";".join([PROCESS, ROOT, *frames]) + f" {count}"


def test_a_functions_lines_add_up_and_each_sample_counts_once_per_function():
    raw = "\n".join(
        [
            stack(WORKER.format(300), HOOK.format(10), count=3),
            stack(WORKER.format(301), HOOK.format(11), HOOK.format(12), count=2),  # recursion
            stack(CONSUMER, POLL, count=5),
            "",
            "not a stack",
        ]
    )
    profile = summarize(raw)
    assert profile.samples == 10
    assert profile.threads == {"WorkerThread.run": 5, "ConsumerThread.run": 5}
    hook = "Status._update (middleware/status.py)"
    assert profile.inclusive[hook] == 5
    assert profile.own[hook] == 5
    assert profile.inclusive["WorkerThread.run (dramatiq/worker.py)"] == 5
    assert profile.own["PollPoller.poll (pika/adapters/select_connection.py)"] == 5


def test_the_summary_keeps_the_projects_and_clients_frames_inclusive():
    raw = stack(CONSUMER, POLL, count=3) + "\n" + stack("helper (/tmp/elsewhere.py:3)", count=1)
    lines = summarize(raw).lines(top=10)
    inclusive = lines[lines.index("  inclusive (the calls made included)") + 1 : lines.index("  self")]
    assert [line.split("%  ", 1)[1] for line in inclusive] == [
        "ConsumerThread.run (dramatiq/worker.py)",
        "PollPoller.poll (pika/adapters/select_connection.py)",
    ]
    assert "     75.0%  ConsumerThread.run" in lines
    assert "     25.0%  other threads" in lines


@pytest.mark.parametrize("raw", ["", "\n\n", "garbage without a count"])
def test_no_samples_is_an_empty_profile(raw):
    profile = summarize(raw)
    assert profile.samples == 0
    assert profile.lines()[0] == "  0 samples; by thread"
