"""A demo whose alive queue went (its connection dropped, or closed through the management API) is
kept while its worker consumes, when its reconnect brings the queue back, and when the queue is
back before the sweep's second look."""

from __future__ import annotations

import threading
from typing import Any

import pika

from demo.alive import SECOND_LOOK_S, AliveQueue, alive_queue
from demo.sweep import find_leftovers, sweep
from jobsystem.ops.management import call_api
from jobsystem.settings import Settings
from tests.connections import named_url
from tests.integration.demo_sweep.leftovers import _demo_prefix
from tests.support import wait_for


def _open(settings: Settings, name: str) -> Any:
    return pika.BlockingConnection(pika.URLParameters(named_url(settings, name)))


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
        code: int = exc.reply_code
        return code == 404
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
    alive = AliveQueue(named_url(settings, f"test-alive-{live}"), live)
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
