"""The Idempotency middleware's paths, its hooks called as the worker calls them, on each state
store backend: dedup at send, claim, complete, release, skip, defer, keys stored hashed."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
from collections.abc import Iterator
from functools import partial
from typing import Any
from unittest.mock import Mock

import pytest
from dramatiq.middleware import SkipMessage

from jobsystem.dramatiq_internals import dead_letter_error, dead_letter_reason
from jobsystem.privacy.keyhash import UNKEYED, KeyHasher
from jobsystem.runtime.idempotency_keys import scoped_key
from jobsystem.store.base import StateStore, StoreUnavailable
from jobsystem.store.redis import RedisStore
from jobsystem.store.sqlite import SqliteStore
from middleware.idempotency import HELD_WAITS, REGISTERED, DuplicateMessage, IdempotencyKeyError
from tests.unit.idempotency_setup import Setup, run, set_up
from tests.unit.stub import delivery


@pytest.fixture
def idem(store: StateStore) -> Iterator[Setup]:
    yield from set_up(store)


def test_a_second_send_with_the_same_key_is_dropped_naming_the_first(idem):
    first, second = idem.message(), idem.message()
    idem.middleware.before_enqueue(idem.broker, first, None)
    with pytest.raises(DuplicateMessage) as caught:
        idem.middleware.before_enqueue(idem.broker, second, None)
    assert caught.value.original_message_id == first.message_id
    assert first.options[REGISTERED] is True and idem.state() == "pending"
    idem.middleware.before_enqueue(idem.broker, first, 1_000)  # a re-enqueue of the same message passes


def test_a_bulk_send_names_each_duplicate_once(idem):
    messages = [idem.message("a"), idem.message("b"), idem.message("a")]
    duplicates = idem.middleware.before_enqueue_batch(idem.broker, messages)
    assert duplicates == {messages[2].message_id: messages[0].message_id}


def test_a_claimed_run_that_succeeds_completes_the_key_with_its_result(idem):
    proxy = delivery(idem.message())
    idem.middleware.before_process_message(idem.broker, proxy)
    assert idem.state() == "running"
    idem.middleware.after_process_message(idem.broker, proxy, result={"sent": 1})
    assert idem.middleware.writes.flush(10)
    record = idem.middleware.lookup("job", "t1")
    assert record is not None and (record.state, record.result) == ("done", '{"sent": 1}')
    assert record.message_id == proxy.message_id


def test_a_result_that_cannot_be_encoded_still_completes_the_key(idem):
    """Too deep for ``json.dumps`` (RecursionError, not a TypeError): the key completes without
    it, rather than the hook failing and the key staying ``running`` until its lease lapses."""
    nested: list[Any] = []
    for _ in range(100_000):
        nested = [nested]
    run(idem, delivery(idem.message()), result=nested)
    record = idem.middleware.lookup("job", "t1")
    assert record is not None and (record.state, record.result) == ("done", None)


def test_a_key_registered_by_a_send_that_failed_is_forgotten_so_the_next_send_goes(idem):
    first = idem.message()
    idem.middleware.before_enqueue(idem.broker, first, None)
    idem.middleware.on_unsent(idem.broker, first)  # the publish raised to the sender
    assert idem.state() is None
    second = idem.message()
    idem.middleware.before_enqueue(idem.broker, second, None)  # not a duplicate
    idem.middleware.after_enqueue(idem.broker, second, None)
    idem.middleware.on_unsent(idem.broker, second)  # published: a later failure is not this send's
    record = idem.middleware.lookup("job", "t1")
    assert record is not None and (record.state, record.message_id) == ("pending", second.message_id)


def test_a_message_sent_again_after_its_key_could_not_be_given_back_gives_it_back_when_it_fails_again(
    idem, monkeypatch
):
    # The first failure's give-back met a store that did not answer: the key stayed pending for
    # the same message, which the caller then sends again; that send fails too, store back up.
    message = idem.message()
    idem.middleware.before_enqueue(idem.broker, message, None)
    with monkeypatch.context() as patched:
        patched.setattr(
            idem.middleware.backend, "unregister_many", Mock(side_effect=StoreUnavailable("down"))
        )
        idem.middleware.on_unsent(idem.broker, message)
    assert idem.state() == "pending" and REGISTERED not in message.options
    idem.middleware.before_enqueue(idem.broker, message, None)  # the key is its own: not a duplicate
    idem.middleware.on_unsent(idem.broker, message)
    assert idem.state() is None  # given back: a new message with the key is published


def test_a_failed_bulk_send_gives_back_the_keys_of_its_unpublished_messages_in_one_call(idem, monkeypatch):
    messages = [idem.message(token) for token in ("a", "b", "c")]
    idem.middleware.before_enqueue_batch(idem.broker, messages)
    idem.middleware.after_enqueue(idem.broker, messages[0], None)  # confirmed
    calls: list[list[tuple[str, str]]] = []
    unregister = idem.middleware.backend.unregister_many
    monkeypatch.setattr(idem.middleware.backend, "unregister_many", lambda items: calls.append(items))
    idem.middleware.on_unsent_batch(idem.broker, messages)  # as send_bulk: every message not confirmed
    assert [len(items) for items in calls] == [2]
    unregister(calls[0])
    assert [idem.state(token) for token in ("a", "b", "c")] == ["pending", None, None]
    # Sent again as they are, the messages not published register their keys again.
    assert [REGISTERED in m.options for m in messages] == [True, False, False]
    assert idem.middleware.before_enqueue_batch(idem.broker, messages[1:]) == {}
    assert [idem.state(token) for token in ("b", "c")] == ["pending", "pending"]


def test_a_store_down_while_giving_keys_back_is_logged_and_the_keys_stay(idem, monkeypatch, caplog):
    messages = [idem.message(token) for token in ("a", "b")]
    idem.middleware.before_enqueue_batch(idem.broker, messages)

    def down(items: list[tuple[str, str]]) -> None:
        raise StoreUnavailable("store down")

    monkeypatch.setattr(idem.middleware.backend, "unregister_many", down)
    idem.middleware.on_unsent_batch(idem.broker, messages)  # does not raise: the send's error is
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert "idempotency_unregister_failed" in errors
    assert [idem.state(token) for token in ("a", "b")] == ["pending", "pending"]


def test_unregistering_keeps_a_key_that_is_another_messages_or_that_ran(idem):
    backend = idem.middleware.backend
    backend.register_many([("other", "m1", 60_000), ("claimed", "m2", 60_000), ("mine", "m3", 60_000)])
    backend.claim("claimed", "m2", "owner", 10_000, 60_000)  # the publish went through after all
    backend.unregister_many([("other", "m9"), ("claimed", "m2"), ("mine", "m3")])
    assert [
        (r.state, r.message_id) if r else None for r in map(backend.lookup, ["other", "claimed", "mine"])
    ] == [
        ("pending", "m1"),
        ("running", "m2"),
        None,
    ]


def ms_left(store: StateStore, key: str) -> int:
    """How long the store keeps ``key`` (an Idempotency-scoped key) from now."""
    name = store.key("idem2:" + key)
    if isinstance(store, RedisStore):
        return int(store.client.pttl(name))
    assert isinstance(store, SqliteStore)  # the other backend the fixture gives
    (expires_at,) = (
        store.connection().execute("SELECT expires_at FROM idempotency WHERE key = ?", (name,)).fetchone()
    )
    return int(expires_at - store.now_ms())


def test_a_job_re_enqueued_to_wait_longer_than_half_its_keys_ttl_keeps_its_key_through_the_wait(idem, store):
    # A retry backing off (or a deferral for a slot) past the key's TTL would let the key expire:
    # a duplicate sent in the gap would run, then this one too once that one's record expired.
    sent = idem.broker.enqueue(idem.message("long"))  # registered: kept 60 s
    short = idem.broker.enqueue(idem.message("short"))
    key_of = partial(idem.middleware.scoped, "job")
    idem.broker.enqueue(sent, delay=10 * 60_000)  # the retry, ten minutes later
    idem.broker.enqueue(short, delay=20_000)  # within half the TTL: the key lives long enough
    assert 10 * 60_000 + 60_000 - 5_000 <= ms_left(store, key_of("long")) <= 11 * 60_000
    assert 55_000 <= ms_left(store, key_of("short")) <= 60_000  # not asked: the TTL it had


def test_a_duplicate_of_a_completed_key_is_skipped_not_deferred(idem):
    run(idem, delivery(idem.message()))
    with pytest.raises(SkipMessage, match="duplicate"):
        idem.middleware.before_process_message(idem.broker, delivery(idem.message()))
    assert idem.deferred() == []


def test_a_key_held_by_another_worker_defers_the_copy_without_a_retry(idem):
    idem.middleware.backend.claim(idem.middleware.scoped("job", "t1"), "other", "someone", 10_000, 60_000)
    proxy = delivery(idem.message().copy(options={"retries": 2}))
    with pytest.raises(SkipMessage, match="held"):
        idem.middleware.before_process_message(idem.broker, proxy)
    (copy,) = idem.deferred()
    assert copy.message_id == proxy.message_id and copy.options["retries"] == 2
    assert copy.options[HELD_WAITS] == 1 and not proxy.failed


def test_a_failed_run_releases_its_claim_for_the_retry(idem):
    run(idem, delivery(idem.message()), exception=RuntimeError("failed"))
    assert idem.state() == "pending"
    run(idem, delivery(idem.message()))  # the retry claims it and completes it
    assert idem.state() == "done"


def test_a_skip_after_the_claim_gives_it_back_at_once(idem):
    proxy = delivery(idem.message())
    idem.middleware.before_process_message(idem.broker, proxy)
    idem.middleware.after_skip_message(idem.broker, proxy)  # e.g. the actor raised RateLimited
    assert idem.state() == "pending"  # not deferred to the background writes


def test_an_invalid_key_dead_letters_the_message_with_the_error(idem):
    proxy = delivery(idem.message("t", bad=True))
    with pytest.raises(SkipMessage):
        idem.middleware.before_process_message(idem.broker, proxy)
    assert proxy.failed and dead_letter_reason(proxy) == "rejected"
    assert isinstance(dead_letter_error(proxy), IdempotencyKeyError)


def test_an_unreachable_store_defers_the_message_instead_of_running_it():
    down = Setup(RedisStore("redis://127.0.0.1:1/0", socket_timeout=0.2))
    proxy = delivery(down.message())
    with pytest.raises(SkipMessage, match="store_unavailable"):
        down.middleware.before_process_message(down.broker, proxy)
    (copy,) = down.deferred()
    assert copy.options["idempotency_store_waits"] == 1 and not proxy.failed


def test_keys_are_stored_hashed(idem, store):
    run(idem, delivery(idem.message("ana@example.com")))
    assert idem.state("ana@example.com") == "done"
    if isinstance(store, RedisStore):
        names = [k.decode() for k in store.client.scan_iter(f"{store.namespace}*", count=10_000)]
    else:
        names = [row[0] for row in store.connection().execute("SELECT key FROM idempotency")]
    assert names and not any("ana@example.com" in name for name in names)


@pytest.mark.parametrize("secret", [None, "a shared secret", b"\x00raw bytes\xff"])
def test_key_hashes_are_hmac_sha256_of_the_text_so_stored_names_never_change(secret):
    """Every process, release and operator tool must land on the same store names: the hash is
    HMAC-SHA256 (RFC 2104) under the secret (or the public key), 32 hex digits, however computed."""
    raw = secret.encode() if isinstance(secret, str) else secret
    hasher = KeyHasher(secret)
    for text in ("a", "send_email:ana@example.com|welcome||", "lone \ud800 surrogate", "x" * 500):
        expected = hmac.new(raw or UNKEYED, text.encode("utf-8", "surrogatepass"), hashlib.sha256)
        assert hasher(text) == expected.hexdigest()[:32]
        assert hasher(text) == expected.hexdigest()[:32]  # the remembered one too


#: One key in its two Unicode forms: composed (NFC, as Linux and most keyboards give it) and
#: decomposed (NFD, ``e`` then U+0301, as macOS file names and some forms give it).
CAFE_NFC, CAFE_NFD = "caf\u00e9:ana", "cafe\u0301:ana"


def test_one_key_sent_in_two_unicode_forms_is_one_key(idem):
    """``café`` typed on a Mac and on Linux: the second send is a duplicate of the first, a
    lookup in either form finds it, and a run of either form skips once the other completed."""
    assert CAFE_NFC != CAFE_NFD
    first, second = idem.message(CAFE_NFD), idem.message(CAFE_NFC)
    idem.middleware.before_enqueue(idem.broker, first, None)
    with pytest.raises(DuplicateMessage) as caught:
        idem.middleware.before_enqueue(idem.broker, second, None)
    assert caught.value.original_message_id == first.message_id
    assert idem.state(CAFE_NFC) == idem.state(CAFE_NFD) == "pending"
    messages = [idem.message("b" + CAFE_NFC), idem.message("b" + CAFE_NFD)]
    assert idem.middleware.before_enqueue_batch(idem.broker, messages) == {
        messages[1].message_id: messages[0].message_id
    }
    run(idem, delivery(first))
    again = delivery(idem.message(CAFE_NFC))
    with pytest.raises(SkipMessage):
        idem.middleware.before_process_message(idem.broker, again)
    assert idem.state(CAFE_NFC) == "done"


def test_an_ascii_key_is_stored_under_the_name_it_always_had():
    """Keys in flight across an upgrade keep their names: an ASCII key is hashed as it is (HMAC
    of ``actor:key``); another key as its NFC form, whichever form it came in."""
    ascii_keys = [(key, key) for key in ("t1", "send_email:ana@example.com|welcome||", "schedule:x")]
    for key, hashed in (*ascii_keys, (CAFE_NFD, CAFE_NFC), (CAFE_NFC, CAFE_NFC)):
        text = f"job:{hashed}".encode()
        expected = hmac.new(UNKEYED, text, hashlib.sha256).hexdigest()[:32]
        assert scoped_key(KeyHasher(), "job", key) == f"job:{expected}"


def test_a_delivery_for_no_declared_actor_is_not_claimed_nor_held(idem):
    """The consumer's thread dead-letters it: no claim grabs its key."""
    message = dataclasses.replace(idem.message("orphan"), actor_name="gone")
    message.options["idempotency_key"] = "orphan"
    proxy = delivery(message)
    idem.middleware.on_receive(idem.broker, [proxy])
    assert proxy.claim_ahead is None
    assert idem.middleware.ahead.unstarted() == []
