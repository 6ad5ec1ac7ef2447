"""The sweep a demo runs as it starts, against the real RabbitMQ and Redis: a dead demo's queues,
delay-cascade exchanges, state keys and folder go; a live demo's (its alive queue held by another
connection, or gone while its connection is down but its worker consuming, or back within the
second look), the sweeping demo's own and every name outside ``demo-xxxxxx-`` stay, and so does
a folder whose prefix has nothing on this vhost (a demo of this host on another RabbitMQ).

The tests sweep only the prefixes they made (``sweep`` on their part of ``find_leftovers``): the
vhost is shared, and a demo of an older release running beside them has no alive queue."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pika
import pytest
import redis

from demo.alive import SECOND_LOOK_S, AliveQueue, alive_queue
from demo.folders import folder_for, mark_folder, vhost_of
from demo.services import delete_named, listed_names
from demo.sweep import Leftovers, find_leftovers, sweep
from jobsystem.ops.management import call_api
from jobsystem.rabbitmq.broker import connection_urls
from jobsystem.rabbitmq.delays import DelayCascade
from jobsystem.settings import Settings, load_settings
from jobsystem.store.redis import delete_matching
from tests.support import TEST_REDIS_URL, wait_for

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

    def __init__(self, settings: Settings, channel: Any, client: redis.Redis, folders: Path) -> None:
        self.settings, self.channel, self.client = settings, channel, client
        self.folders = folders  # the temporary directory the demos' folders are in
        self.starts: list[str] = []

    def demo(self, prefix: str, *, queues: bool = True, keys: bool = True, vhost: str | None = None) -> Path:
        """A demo's leftovers under ``prefix``: work queues, the delay cascade, two state keys,
        and its folder (returned) with a file in it, marked with ``vhost`` (default: this one)."""
        self.starts.append(prefix)
        folder = folder_for(prefix, self.folders)
        folder.mkdir(mode=0o700)
        mark_folder(folder, vhost or vhost_of(self.settings.rabbitmq_url))
        (folder / "state.db").write_bytes(b"x")
        if queues:
            for name in _WORK_QUEUES:
                self.channel.queue_declare(prefix + name, durable=True)
            DelayCascade(prefix).declare(self.channel)
        if keys:
            self.client.set(f"jobs:{prefix}status:1", "x")
            self.client.set(f"jobs:{prefix}idem:1", "x")
        return folder

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
def made(settings: Settings, channel: Any, client: redis.Redis, tmp_path: Path) -> Iterator[Made]:
    made = Made(settings, channel, client, tmp_path)
    yield made
    made.delete_all()


def test_a_dead_demos_leftovers_go_and_a_live_ones_stay(settings, made, channel):
    dead, keys_only, live, own = (_demo_prefix() for _ in range(4))
    folders = {
        dead: made.demo(dead),  # killed with SIGKILL (or a release without alive queues): none
        keys_only: made.demo(keys_only, queues=False),  # killed halfway through its clean-up
        live: made.demo(live),
        own: made.demo(own),  # the sweeping demo's own prefix is never swept
    }
    channel.queue_declare(alive_queue(live), exclusive=True)  # held: the demo runs
    found = find_leftovers(settings, made.folders)
    assert {dead, keys_only, live, own} <= set(found)
    assert set(found[dead].queues) >= {dead + q for q in _WORK_QUEUES} | set(DelayCascade(dead).queues())
    assert set(found[dead].exchanges) == set(DelayCascade(dead).exchanges())
    assert {p: found[p].folders for p in folders} == {p: [folder] for p, folder in folders.items()}
    live_before, own_before = made.under(live), made.under(own)

    swept = sweep(settings, own, {p: found[p] for p in (dead, keys_only, live, own)})

    assert sorted(swept.demos) == sorted([dead, keys_only])
    assert swept.queues == len(_WORK_QUEUES) + len(DelayCascade(dead).queues()) + 1  # and unroutable
    assert swept.exchanges == len(DelayCascade(dead).exchanges())
    assert (swept.state_keys, swept.folders) == (4, 2)
    assert "2 folders" in swept.line()
    assert made.under(dead) == made.under(keys_only) == ([], [], [])
    assert not folders[dead].exists() and not folders[keys_only].exists()
    assert made.under(live) == live_before and alive_queue(live) in live_before[0]
    assert made.under(own) == own_before
    assert (folders[live] / "state.db").exists() and (folders[own] / "state.db").exists()


def test_only_a_dead_demos_own_folders_go(settings, made, tmp_path):
    """A folder goes with its prefix judged dead, and only a directory of its own name: a folder
    whose prefix has nothing on this vhost (its demo may be live on another RabbitMQ), names that
    only look alike, an older release's ``jobs-demo-`` folder and a link stay."""
    dead, elsewhere = _demo_prefix(), _demo_prefix()
    folder = made.demo(dead)
    alone = folder_for(elsewhere, tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_bytes(b"x")
    tail = folder.name.removeprefix(f"jobs-{dead}")
    kept = [
        alone,
        tmp_path / f"jobs-{dead}{tail}x",  # too long
        tmp_path / f"jobs-{dead}{tail[:-1]}",  # too short
        tmp_path / f"jobs-{dead.upper()}{tail}",
        tmp_path / f"xjobs-{dead}{tail}",
        tmp_path / "jobs-demo-k3x9_q0z",  # an older release's (mkdtemp's) name: no prefix in it
    ]
    for path in kept:
        path.mkdir()
    link = folder_for(dead, tmp_path)
    link.symlink_to(outside, target_is_directory=True)
    found = find_leftovers(settings, tmp_path)
    assert elsewhere not in found and found[dead].folders == [folder]

    swept = sweep(settings, "", {dead: found[dead]})

    assert swept.demos == [dead] and swept.folders == 1 and not folder.exists()
    assert all(path.is_dir() for path in kept) and link.is_symlink() and (outside / "keep").exists()


def test_a_live_demo_on_another_vhost_sharing_the_redis_is_no_candidate(settings, made):
    """A demo of this host runs on another vhost (or RabbitMQ) with the same Redis: this sweep sees
    its state keys and its folder, nothing of it on this vhost, which is all a live demo there
    leaves here. Judged on this vhost it would look dead: its folder (reports, media, schedules)
    and its keys would go while it runs. Its folder's mark names its vhost: no candidate. Keys
    alone, without a folder marked with this vhost, make none either."""
    elsewhere, keys_only = _demo_prefix(), _demo_prefix()
    folder = made.demo(elsewhere, queues=False, vhost="rabbit-2:5672/other")
    (folder / "reports").mkdir()
    made.demo(keys_only, queues=False).rename(made.folders / "not-a-demo-folder")
    before = made.under(elsewhere), made.under(keys_only)
    found = find_leftovers(settings, made.folders)  # what a demo's sweep judges and deletes

    assert elsewhere not in found and keys_only not in found
    assert (folder / "reports").is_dir()
    assert (made.under(elsewhere), made.under(keys_only)) == before and before[0][2] and before[1][2]


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


def _named_url(settings: Settings, name: str) -> str:
    """The AMQP URL with a connection name, by which the management API finds the connection."""
    url = connection_urls(settings)[0]
    return f"{url}{'&' if '?' in url else '?'}client_properties={quote(repr({'connection_name': name}))}"


def _open(settings: Settings, name: str) -> Any:
    return pika.BlockingConnection(pika.URLParameters(_named_url(settings, name)))


def _close_by_api(settings: Settings, name: str) -> None:
    """Close the connection called ``name`` by the management API, as RabbitMQ closes one whose
    heartbeats stopped (a network blip, the demo paused past two missed heartbeats)."""

    def listed() -> list[str]:
        api = settings.management_api("connections")
        found = call_api(settings, "GET", api, 10, params={"columns": "name,client_properties"})
        return [c["name"] for c in found if c.get("client_properties", {}).get("connection_name") == name]

    for connection in wait_for(listed, timeout=30, what=f"the connection {name}"):
        call_api(settings, "DELETE", settings.management_api("connections", connection), 10)


def _absent(channel: Any, queue: str) -> bool:
    """Whether ``queue`` is gone (a passive declare on a channel of its own)."""
    probe = channel.connection.channel()
    try:
        probe.queue_declare(queue, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        return exc.reply_code == 404
    probe.close()
    return False


def test_a_demo_whose_alive_connection_dropped_but_whose_worker_consumes_stays(settings, made, channel):
    paused, dead = _demo_prefix(), _demo_prefix()
    made.demo(paused)
    made.demo(dead)
    holder = _open(settings, f"test-alive-{paused}")  # never reconnects: the demo stays paused
    holder.channel().queue_declare(alive_queue(paused), exclusive=True)
    worker = _open(settings, f"test-worker-{paused}")  # the paused demo's worker goes on consuming
    worker.channel().basic_consume(paused + "emails", lambda *_: None)
    try:
        _close_by_api(settings, f"test-alive-{paused}")
        wait_for(lambda: _absent(channel, alive_queue(paused)), timeout=30, what="the alive queue to go")
        found = find_leftovers(settings)
        live_before = made.under(paused)

        swept = sweep(settings, "", {p: found[p] for p in (paused, dead)})

        assert swept.demos == [dead] and made.under(dead) == ([], [], [])
        assert made.under(paused) == live_before and paused + "emails" in live_before[0]
    finally:
        worker.close()


def test_a_demo_whose_alive_connection_dropped_is_kept_by_its_reconnect(settings, made):
    live = _demo_prefix()
    made.demo(live)
    alive = AliveQueue(_named_url(settings, f"test-alive-{live}"), live)
    alive.start()
    try:
        _close_by_api(settings, f"test-alive-{live}")
        found = find_leftovers(settings)
        live_before = made.under(live)

        swept = sweep(settings, "", {live: found[live]})

        assert swept.demos == []
        after = made.under(live)
        assert set(live_before[0]) - {alive_queue(live)} <= set(after[0])
        assert after[1:] == live_before[1:]
    finally:
        alive.close()


def test_an_alive_queue_back_before_the_second_look_keeps_its_demo(settings, made, channel):
    live = _demo_prefix()
    made.demo(live)
    holder = _open(settings, f"test-alive-{live}")
    holder.channel().queue_declare(alive_queue(live), exclusive=True)
    holder.close()  # the demo's connection down: no alive queue, and no consumer anywhere
    assert _absent(channel, alive_queue(live))
    back: list[Any] = []

    def reconnect() -> None:
        back.append(_open(settings, f"test-alive-{live}"))
        back[0].channel().queue_declare(alive_queue(live), exclusive=True)

    timer = threading.Timer(SECOND_LOOK_S / 3, reconnect)  # within the wait, after the first look
    found = find_leftovers(settings)
    live_before = made.under(live)
    timer.start()
    try:
        swept = sweep(settings, "", {live: found[live]})

        assert swept.demos == []
        after = made.under(live)
        assert set(live_before[0]) | {alive_queue(live)} <= set(after[0])
        assert after[1:] == live_before[1:]
    finally:
        timer.join()
        for connection in back:
            connection.close()
