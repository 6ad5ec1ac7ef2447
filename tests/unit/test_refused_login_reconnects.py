"""A Redis reply that refuses this client's configuration (``NOAUTH``, ``NOPERM``, a database
index it lacks) drops the connection that got it: the next command logs in anew.

Such a reply may pass with a new connection: a proxy (TLS, cluster, a cloud endpoint) whose Redis
behind it restarted with ``requirepass`` answers ``NOAUTH`` on every connection opened before, and
a new one authenticates. A deferred completion retried on the same connection got the same answer
for good. Here the test Redis's ``ERR DB index is out of range`` (a refusal of the configuration,
``StoreMisconfigured``) stands for them on each of the store's three ways to Redis: a script over
the thread's own connection, a line of replies read later, the client's pool.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from jobsystem.store.base import StoreMisconfigured
from jobsystem.store.redis import RedisStore
from jobsystem.store.redis_replies import ReplyLine
from tests.support import fresh_store


@pytest.fixture
def redis_store(tmp_path: Path) -> Iterator[RedisStore]:
    with fresh_store("redis", tmp_path) as store:
        assert isinstance(store, RedisStore)
        yield store


def own_connection_id(store: RedisStore) -> int:
    conn = store.raw_connection()
    conn.send_command("CLIENT", "ID")
    return int(conn.read_response())


def test_a_script_refused_drops_the_threads_own_connection(redis_store: RedisStore) -> None:
    before = own_connection_id(redis_store)
    with pytest.raises(StoreMisconfigured):
        redis_store.script("return redis.call('SELECT', 999)")([], [])
    assert own_connection_id(redis_store) != before


def test_a_reply_refused_on_a_line_drops_the_lines_connection(redis_store: RedisStore) -> None:
    line = ReplyLine(redis_store)
    before = line.send("CLIENT", "ID")()
    with pytest.raises(StoreMisconfigured):
        line.send("SELECT", 999)()
    assert line.send("CLIENT", "ID")() != before


def test_a_command_refused_through_the_pool_drops_its_idle_connections(redis_store: RedisStore) -> None:
    before = redis_store.client.client_id()
    with pytest.raises(StoreMisconfigured), redis_store.errors():
        redis_store.client.execute_command("SELECT", 999)  # type: ignore[no-untyped-call]
    assert redis_store.client.client_id() != before
