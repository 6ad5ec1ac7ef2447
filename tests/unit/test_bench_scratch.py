"""The bench's scratch environment deletes its own keys, and nothing else."""

from __future__ import annotations

import os

import pytest
import redis

from bench import scratch

URL = "redis://127.0.0.1:6379/15"


@pytest.mark.parametrize(
    "prefix", ["", "jobs:", "prod.", "bench.", "benchABCDEF.", "bench123456", "bench1234567."]
)
def test_only_a_bench_prefix_is_deleted(prefix):
    with pytest.raises(ValueError, match="not a bench's prefix"):
        scratch.delete_state(URL, prefix)


def test_the_state_of_a_bench_prefix_is_deleted_and_its_neighbours_kept():
    client = redis.Redis.from_url(URL)
    prefix, other = scratch.new_prefix(), scratch.new_prefix()
    mine = [f"jobs:{prefix}status:{i}" for i in range(2_500)]
    kept = [f"jobs:{other}status:1", f"jobs:{prefix[:-1]}status:1", f"test:{prefix}status:1"]
    try:
        client.mset(dict.fromkeys(mine + kept, "1"))
        assert scratch.delete_state(URL, prefix) == len(mine)
        assert client.exists(*mine) == 0 and client.exists(*kept) == len(kept)
    finally:
        client.delete(*mine, *kept)


def test_the_environment_sets_the_prefix_and_deletes_its_state_even_after_an_error(monkeypatch):
    monkeypatch.delenv("QUEUE_PREFIX", raising=False)
    client = redis.Redis.from_url(URL)
    with pytest.raises(RuntimeError), scratch.environment(URL) as prefix:
        assert os.environ["QUEUE_PREFIX"] == prefix
        client.set(f"jobs:{prefix}idem2:k", "1")
        raise RuntimeError("a row failed")
    assert "QUEUE_PREFIX" not in os.environ and not client.exists(f"jobs:{prefix}idem2:k")
