"""The sweep a demo runs as it starts, against the real RabbitMQ and Redis: a dead demo's queues,
delay-cascade exchanges and state keys go; a live demo's (its alive queue held by another
connection), the sweeping demo's own and every name outside ``demo-xxxxxx-`` stay.

The tests sweep only the prefixes they made (``sweep`` on their part of ``find_leftovers``): the
vhost is shared, and a demo of an older release running beside them has no alive queue."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pika
import pytest
import redis

from demo.alive import alive_queue
from demo.services import delete_named, listed_names
from demo.sweep import Leftovers, find_leftovers, sweep
from jobsystem.rabbitmq.broker import connection_urls
from jobsystem.rabbitmq.delays import DelayCascade
from jobsystem.settings import Settings, load_settings
from jobsystem.store.redis import delete_matching
from tests.support import TEST_REDIS_URL

_WORK_QUEUES = ("emails", "emails.DQ", "emails.DLQ")


def _demo_prefix() -> str:
    return f"demo-{uuid.uuid4().hex[:6]}-"


@pytest.fixture
def settings() -> Settings:
    return load_settings({**os.environ, "STATE_URL": TEST_REDIS_URL})


@pytest.fixture
def channel(settings: Settings) -> Iterator[Any]:
    connection = pika.BlockingConnection(pika.URLParameters(connection_urls(settings)[0]))
    yield connection.channel()
    connection.close()


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(TEST_REDIS_URL)
    yield client
    client.close()


class Made:
    """The names a test made, all deleted at its end (the sweep's or not)."""

    def __init__(self, settings: Settings, channel: Any, client: redis.Redis) -> None:
        self.settings, self.channel, self.client = settings, channel, client
        self.starts: list[str] = []

    def demo(self, prefix: str, *, queues: bool = True, keys: bool = True) -> None:
        """A demo's leftovers under ``prefix``: work queues, the delay cascade, two state keys."""
        self.starts.append(prefix)
        if queues:
            for name in _WORK_QUEUES:
                self.channel.queue_declare(prefix + name, durable=True)
            DelayCascade(prefix).declare(self.channel)
        if keys:
            self.client.set(f"jobs:{prefix}status:1", "x")
            self.client.set(f"jobs:{prefix}idem:1", "x")

    def other(self, name: str) -> None:
        """A queue and a key that are not a demo's, though their names look alike."""
        self.starts.append(name)
        self.channel.queue_declare(name, durable=True)
        self.client.set(f"jobs:{name}", "x")

    def under(self, start: str) -> tuple[list[str], list[str], list[bytes]]:
        """The queues, exchanges and keys under ``start``, sorted (SCAN's order changes as Redis
        rehashes, e.g. after other keys were deleted)."""
        return (
            sorted(listed_names(self.settings, "queues", start)),
            sorted(listed_names(self.settings, "exchanges", start)),
            sorted(self.client.scan_iter(f"jobs:{start}*", count=1000)),
        )

    def delete_all(self) -> None:
        for start in self.starts:
            for kind in ("queues", "exchanges"):
                for name in listed_names(self.settings, kind, start):
                    if name != alive_queue(start):  # goes with the test's connection
                        delete_named(self.settings, kind, name)
            delete_matching(self.client, f"jobs:{start}*")


@pytest.fixture
def made(settings: Settings, channel: Any, client: redis.Redis) -> Iterator[Made]:
    made = Made(settings, channel, client)
    yield made
    made.delete_all()


def test_a_dead_demos_leftovers_go_and_a_live_ones_stay(settings, made, channel):
    dead, keys_only, live, own = (_demo_prefix() for _ in range(4))
    made.demo(dead)  # killed with SIGKILL (or a release without alive queues): none
    made.demo(keys_only, queues=False)  # killed halfway through its clean-up
    made.demo(live)
    channel.queue_declare(alive_queue(live), exclusive=True)  # held: the demo runs
    made.demo(own)  # the sweeping demo's own prefix is never swept
    found = find_leftovers(settings)
    assert {dead, keys_only, live, own} <= set(found)
    assert set(found[dead].queues) >= {dead + q for q in _WORK_QUEUES} | set(DelayCascade(dead).queues())
    assert set(found[dead].exchanges) == set(DelayCascade(dead).exchanges())
    live_before, own_before = made.under(live), made.under(own)

    swept = sweep(settings, own, {p: found[p] for p in (dead, keys_only, live, own)})

    assert sorted(swept.demos) == sorted([dead, keys_only])
    assert swept.queues == len(_WORK_QUEUES) + len(DelayCascade(dead).queues()) + 1  # and unroutable
    assert swept.exchanges == len(DelayCascade(dead).exchanges())
    assert swept.state_keys == 4
    assert made.under(dead) == made.under(keys_only) == ([], [], [])
    assert made.under(live) == live_before and alive_queue(live) in live_before[0]
    assert made.under(own) == own_before


def test_names_outside_the_demo_prefix_are_never_candidates(settings, made):
    tail = uuid.uuid4().hex[:6]
    lookalikes = [f"demox-{tail}-q", f"mine-demo-{tail}-q", f"demo-{tail}x-q", f"demo-{tail.upper()}z-q"]
    for name in lookalikes:
        made.other(name)
    found = find_leftovers(settings)
    assert not [p for p in found if tail in p or tail.upper() in p]
    # Handed to the sweep anyway, as if found: refused, they are no demo's prefix.
    swept = sweep(settings, "", {name: Leftovers(queues=[name]) for name in lookalikes})
    assert swept.demos == []
    for name in lookalikes:
        assert made.under(name) == ([name], [], [f"jobs:{name}".encode()])
