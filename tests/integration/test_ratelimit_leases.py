"""Token leases end to end: two worker processes spending from one hot bucket, partly from leases,
on each state store backend; the burst bound is checked over every window of the jobs' recorded
start times, with the slack of ``tests/integration/test_ratelimit.py``."""

from __future__ import annotations

import time

from jobsystem.rabbitmq.bulk import send_bulk
from tests import workload
from tests.integration.test_ratelimit import TIMING_SLACK, assert_conforms, limits, starts
from tests.senders import sender_broker
from tests.workers import json_lines

RATE, BURST = 400, 160  # leases of 10 jobs (1/16 of the burst; 50 ms of the rate is 20)


def test_two_processes_leasing_from_one_bucket_keep_the_burst_bound(
    start_worker, queues, store, prefix, state_url
):
    worker = start_worker(
        processes=2, threads=4, STATE_URL=state_url, RATE_LIMITS=limits(hot={"rate": RATE, "burst": BURST})
    )
    sender = queues.using(sender_broker(prefix, state_url))
    queue = queues.name(workload.limited)
    first = [f"a{i}" for i in range(1_200)]  # 7.5 bursts' worth: the bucket runs dry
    send_bulk([sender.message(workload.limited, token, "hot") for token in first], broker=sender.broker)
    sender.wait_totals(queue, timeout=120, succeeded=len(first))
    # The bucket refills while leases taken in the first round may still be held: a second round
    # then starts at once from bucket and leases together, which must still stay within the burst.
    time.sleep(BURST / RATE)
    second = [f"b{i}" for i in range(600)]
    send_bulk([sender.message(workload.limited, token, "hot") for token in second], broker=sender.broker)
    sender.wait_totals(queue, timeout=120, succeeded=len(first) + len(second))
    assert queues.left_after_stop([worker], queue) == 0  # the shutdown log lines are in too
    notes = starts(store, prefix)
    assert sorted(n["token"] for n in notes) == sorted(first + second)  # each job ran once
    assert {n["retries"] for n in notes} == {0}
    times = sorted(n["t"] for n in notes)
    assert_conforms(times, rate=RATE, burst=BURST)
    firsts = sorted(n["t"] for n in notes if n["token"].startswith("a"))
    assert firsts[-1] - firsts[0] >= (len(first) - BURST) / RATE - TIMING_SLACK
    tallies = [e for e in json_lines(worker.output()) if e.get("event") == "rate_limit_leases"]
    assert len(tallies) >= 1 and sum(e["spent"] for e in tallies) > 0  # jobs did run from leases
    for tally in tallies:
        assert tally["spent"] + tally["dropped"] == tally["leased"]
    assert queues.depth(queue + ".DLQ") == 0
