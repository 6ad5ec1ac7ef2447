"""``bench.store_instructions`` counts what the store's scripts cost a Redis under callgrind: the
same figure for the same call, and a bigger one for more work."""

from __future__ import annotations

import re
import shutil

import pytest

from bench.callgrind import callgrind_redis
from bench.store_instructions import TIMEOUT_S, idempotency_costs, status_costs
from jobsystem.store import open_store
from jobsystem.store.redis import RedisStore
from tests.support import run_bench

pytestmark = pytest.mark.skipif(
    shutil.which("valgrind") is None or shutil.which("redis-server") is None,
    reason="needs valgrind and redis-server",
)


def test_the_same_call_costs_the_same_instructions_and_more_work_costs_more():
    with callgrind_redis() as server:
        store = open_store(server.url, namespace="test-instructions:", timeout=TIMEOUT_S)
        assert isinstance(store, RedisStore)  # a redis:// URL
        try:
            script = store.client.register_script(
                "for i = 1, tonumber(ARGV[1]) do redis.call('SET', KEYS[1], 'x') end"
                " redis.call('INCR', KEYS[2])"
            )
            script(keys=["x", "n"], args=[0])  # loaded first: the first call would also count its loading
            # The same call's count moves by up to ~1.5% on a loaded machine (Redis's event loop and
            # timer run around it as the load allows): still ten times steadier than CPU time
            small = [server.instructions(lambda: script(keys=["x", "n"], args=[5000])) for _ in range(3)]
            large = server.instructions(lambda: script(keys=["x", "n"], args=[50000]))
            assert max(small) - min(small) <= 0.03 * min(small)
            assert large > 5 * min(small)
            assert int(store.client.get("n") or 0) == 5  # each call ran, once

            status = status_costs(server, store, jobs=40, batch=20)
            assert set(status) == {"queued", "running + succeeded"}
            claims = idempotency_costs(server, store, jobs=32)
            assert all(cost > 1 for cost in [*status.values(), *claims.values()])
            # a batch shares one script call's set-up: a claim costs less in a batch of 32
            assert claims["claim, batches of 32"] < claims["claim, batches of 1"]
        finally:
            store.close()


def test_bench_prints_the_instruction_table():
    done = run_bench("--only", "instructions", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = dict(re.findall(r"^  (\S.*?\S)\s+([\d.]+)$", done.stdout, re.M))
    assert "status, running + succeeded, batches of 20" in figures
    assert "idempotency, claim, batches of 4" in figures
    assert len(figures) == 9 and all(float(f) > 1 for f in figures.values())
