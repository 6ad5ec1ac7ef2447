"""Commands whose replies are read later (jobsystem.store.redis_replies), on the test Redis: each
reader gets its own reply whatever the order of reading, an error reply is its command's alone,
and a lost connection or an interrupted read fails every reply still to come, never hands one
reader another's."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import jobsystem.store.redis as redis_module
from jobsystem.store.base import StoreUnavailable
from jobsystem.store.redis import RedisScript, RedisStore, hiredis, send_packed
from jobsystem.store.redis_replies import ReplyLine
from tests.support import fresh_store


@pytest.fixture
def redis_store(tmp_path: Path) -> Iterator[RedisStore]:
    with fresh_store("redis", tmp_path) as store:
        assert isinstance(store, RedisStore)
        yield store


def test_replies_read_in_any_order_are_each_their_own_commands(redis_store):
    line, key = ReplyLine(redis_store), redis_store.key("counter")
    replies = [line.send("SET", key, 1), line.send("INCR", key), line.send("GET", key)]
    assert replies[2]() == b"2"  # read first: the two before it were read and kept
    assert replies[0]() == b"OK" and replies[1]() == 2  # raw replies: no client callbacks
    assert replies[1]() == 2  # a reply can be asked for again


def test_an_error_reply_fails_only_its_own_command(redis_store):
    line, key = ReplyLine(redis_store), redis_store.key("text")
    set_, incr, get = line.send("SET", key, "x"), line.send("INCR", key), line.send("GET", key)
    assert get() == b"x"
    with pytest.raises(StoreUnavailable, match="not an integer"):
        incr()
    assert set_() == b"OK"


def test_a_lost_connection_fails_every_reply_still_to_come_and_the_next_command_connects_again(
    redis_store,
):
    line = ReplyLine(redis_store)
    client_id = line.send("CLIENT", "ID")()
    redis_store.client.client_kill_filter(_id=client_id)
    lost = [line.send("ECHO", "one"), line.send("ECHO", "two")]
    for reply in reversed(lost):
        with pytest.raises(StoreUnavailable):
            reply()
    assert line.send("ECHO", "three")() == b"three"


class Interrupted(BaseException):
    """What a time limit or a cancellation raises in a worker thread, mid-read."""


def interrupt_once(monkeypatch: pytest.MonkeyPatch, conn: Any, method: str) -> None:
    """Make the connection's next ``method`` call raise :class:`Interrupted`, and only that one."""
    original = getattr(conn, method)

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(conn, method, original)
        raise Interrupted

    monkeypatch.setattr(conn, method, interrupted)


def test_a_read_interrupted_fails_the_replies_after_it_and_raises_in_its_own_thread(redis_store, monkeypatch):
    line = ReplyLine(redis_store)
    assert line.send("PING")() == b"PONG"  # connected
    first, second = line.send("ECHO", "one"), line.send("ECHO", "two")
    interrupt_once(monkeypatch, line._conn, "read_response")
    with pytest.raises(Interrupted):
        first()
    with pytest.raises(StoreUnavailable, match="reply lost"):
        second()  # its reply could no longer be told from the first's
    with pytest.raises(StoreUnavailable, match="reply lost"):
        first()  # asked again: lost, not read
    assert line.send("ECHO", "after")() == b"after"


def test_a_script_the_server_does_not_have_is_loaded_and_run(redis_store):
    source = f"return ARGV[1] .. '-{uuid.uuid4().hex}'"  # never loaded before
    script = RedisScript(redis_store, source)
    read = script.send_on(ReplyLine(redis_store), [], ["ran"])
    assert read().startswith(b"ran-")


def test_threads_sending_and_reading_at_once_each_get_their_own_replies(redis_store):
    line, errors = ReplyLine(redis_store), []
    start = threading.Barrier(8)

    def sender(name: int) -> None:
        start.wait()
        for i in range(200):
            token = f"{name}-{i}"
            if line.send("ECHO", token)() != token.encode():
                errors.append(token)

    threads = [threading.Thread(target=sender, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == [] and not any(thread.is_alive() for thread in threads)


def test_a_send_interrupted_fails_the_replies_waiting_and_raises_in_its_own_thread(redis_store, monkeypatch):
    line = ReplyLine(redis_store)
    waiting = line.send("ECHO", "sent before")
    interrupt_once(monkeypatch, line._conn, "send_packed_command")
    with pytest.raises(Interrupted):
        line.send("ECHO", "interrupted")
    with pytest.raises(StoreUnavailable, match="reply lost"):
        waiting()  # whether the second command went out is unknown: nothing after it is trusted
    assert line.send("ECHO", "after")() == b"after"


#: Arguments of every type the store's commands pass: text (not only ASCII), bytes, numbers.
ARGUMENTS = ("EVALSHA", "0" * 40, 2, "k", b"\x00\xff", "n\u00e4me \U0001f600", -7, 10**20, 0.25, 1e-07, "")


def test_commands_are_packed_byte_for_byte_as_redis_py_packs_them(redis_store):
    conn = redis_store.raw_connection()
    assert hiredis is not None  # installed with redis[hiredis]
    assert hiredis.pack_command(ARGUMENTS) == b"".join(conn.pack_command(*ARGUMENTS))


@pytest.mark.parametrize("value", [None, True, ["a list"]])
def test_an_argument_redis_py_refuses_is_refused_before_anything_is_sent(redis_store, value):
    line, key = ReplyLine(redis_store), redis_store.key("refused")
    with pytest.raises(redis.DataError):
        send_packed(redis_store.raw_connection(), ("SET", key, value))
    with pytest.raises(StoreUnavailable):
        line.send("SET", key, value)()
    assert redis_store.client.exists(key) == 0
    assert line.send("ECHO", "after")() == b"after"  # the line carries on


def test_without_hiredis_redis_py_packs_the_commands(redis_store, monkeypatch):
    monkeypatch.setattr(redis_module, "hiredis", None)
    script = RedisScript(redis_store, "return ARGV[1] .. ARGV[2]")
    assert script([], ["n\u00e4me ", 7]) == "n\u00e4me 7".encode()
    assert ReplyLine(redis_store).send("ECHO", "plain")() == b"plain"
