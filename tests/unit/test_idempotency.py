"""The Idempotency middleware's paths, its hooks called as the worker calls them, on each state
store backend: dedup at send, claim, complete, release, skip, defer, claims made at receipt."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import threading
import time
from collections.abc import Iterator
from functools import partial
from typing import Any
from unittest.mock import Mock

import dramatiq
import pytest
from dramatiq.middleware import SkipMessage

from jobsystem.dramatiq_internals import ProjectMessage, dead_letter_error, dead_letter_reason
from jobsystem.privacy.keyhash import UNKEYED, KeyHasher
from jobsystem.runtime import claims_ahead
from jobsystem.runtime.coalesce import Coalescer
from jobsystem.runtime.idempotency_keys import scoped_key
from jobsystem.store.base import StateStore, StoreUnavailable
from jobsystem.store.redis import RedisStore
from jobsystem.store.sqlite import SqliteStore
from middleware.idempotency import (
    HELD_WAITS,
    REGISTERED,
    DuplicateMessage,
    Idempotency,
    IdempotencyKeyError,
)
from tests.unit.stub import RecordingBroker, delivery


class Setup:
    def __init__(self, store: StateStore) -> None:
        self.middleware = Idempotency(store, ttl_ms=60_000, lease_ms=10_000)
        self.broker = RecordingBroker(middleware=[self.middleware])

        def job(token: str, bad: bool = False) -> None: ...

        def key(token: str, bad: bool = False) -> str:
            if bad:
                raise ValueError("no key for this one")
            return token

        declare = dramatiq.actor(broker=self.broker, actor_name="job", queue_name="q", idempotency_key=key)
        self.actor = declare(job)

    def message(self, token: str = "t1", **kwargs: Any) -> Any:
        return self.actor.message(token, **kwargs)

    def state(self, token: str = "t1") -> str | None:
        record = self.middleware.lookup("job", token)
        return record.state if record else None

    def deferred(self) -> list[Any]:
        return [message for message, delay in self.broker.enqueued if delay]


@pytest.fixture
def idem(store: StateStore) -> Iterator[Setup]:
    setup = Setup(store)
    yield setup
    setup.middleware.writes.stop()
    setup.broker.close()


def sent_ahead(proxy: ProjectMessage) -> claims_ahead.Ahead:
    """The claim the middleware sent ahead for ``proxy`` at receipt. The delivery keeps it as an
    ``object`` (dramatiq_internals knows none of the runtime's types): read back as what it is."""
    found = proxy.claim_ahead
    assert isinstance(found, claims_ahead.Ahead), f"no claim sent ahead: {found!r}"
    return found


def run(idem: Setup, proxy: Any, *, result: Any = None, exception: BaseException | None = None) -> None:
    """What the worker does for a message that is not skipped: before, (the actor), after."""
    idem.middleware.before_process_message(idem.broker, proxy)
    idem.middleware.after_process_message(idem.broker, proxy, result=result, exception=exception)
    assert idem.middleware.writes.flush(10)


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


def test_a_claim_sent_ahead_is_used_and_given_back_if_the_message_is_skipped_first(idem):
    ran = delivery(idem.message("ran"))
    idem.middleware.on_receive(idem.broker, [ran])
    assert sent_ahead(ran).claim is not None  # its answer read
    assert idem.state("ran") == "running"
    run(idem, ran)
    assert idem.state("ran") == "done"
    skipped = delivery(idem.message("skipped"))
    idem.middleware.on_receive(idem.broker, [skipped])
    idem.middleware.after_skip_message(idem.broker, skipped)  # the age limit skipped it first
    assert idem.state("skipped") == "pending"


def test_claims_sent_ahead_for_deliveries_that_never_started_are_given_back_at_shutdown(idem):
    for token in ("x", "y"):
        idem.middleware.on_receive(idem.broker, [delivery(idem.message(token))])
    # Given back once granted: the shutdown reads the answers still on their way first (a
    # release overtaking its claim would leave the lease taken).
    idem.middleware.before_consumer_thread_shutdown(idem.broker, None)
    assert (idem.state("x"), idem.state("y")) == ("pending", "pending")


def counted_calls(middleware: Idempotency) -> list[tuple[str, list[Any]]]:
    """Each store call the middleware makes for claims, as ``("ahead" | "start", requests)``
    (on SQLite, claims sent ahead are made by ``claim_many``: counted once, as sent ahead)."""
    calls: list[tuple[str, list[Any]]] = []
    send_claims, claim_many = middleware.backend.send_claims, middleware.backend.claim_many
    sending = threading.local()

    def ahead(requests: list[Any]) -> Any:
        calls.append(("ahead", requests))
        sending.now = True
        try:
            return send_claims(requests)
        finally:
            sending.now = False

    def at_start(requests: list[Any]) -> Any:
        if not getattr(sending, "now", False):
            calls.append(("start", requests))
        return claim_many(requests)

    middleware.backend.send_claims = ahead  # type: ignore[method-assign]
    middleware.backend.claim_many = at_start  # type: ignore[method-assign]
    return calls


def trust_every_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Answers made ahead trusted however long the jobs before take: on a loaded machine the
    runs of a burst can outlast the 100 ms an answer is trusted without a store seen since
    (``FRESH_S``), and a job then claims again at its start, as it must (tested on its own)."""
    monkeypatch.setattr(claims_ahead, "FRESH_S", 60.0)


def test_the_claims_of_a_burst_go_to_the_store_in_one_call(idem, monkeypatch):
    trust_every_answer(monkeypatch)
    middleware = idem.middleware
    calls = counted_calls(middleware)
    burst = [delivery(idem.message(token)) for token in ("a", "b", "c")]
    orphan = delivery(dataclasses.replace(idem.message("d"), actor_name="gone"))  # not claimed
    middleware.on_receive(idem.broker, [*burst, orphan])
    assert [(kind, [r.message_id for r in requests]) for kind, requests in calls] == [
        ("ahead", [proxy.message_id for proxy in burst])
    ]
    for proxy in burst:
        run(idem, proxy)
    assert len(calls) == 1  # each job started on its answer, read by the first
    assert [idem.state(token) for token in ("a", "b", "c")] == ["done"] * 3


def test_a_burst_of_one_leaves_before_its_answer_and_a_larger_one_waits_for_it(idem, monkeypatch):
    """An idle worker's single delivery is handed out with its claim on its way, and its job reads
    the answer; a later burst sent meanwhile is not mistaken for it. A busy worker's burst is
    answered before any of it is handed out (its threads would otherwise wait on each other)."""
    trust_every_answer(monkeypatch)
    middleware = idem.middleware
    calls = counted_calls(middleware)
    one = delivery(idem.message("one"))
    middleware.on_receive(idem.broker, [one])
    burst_of_one = sent_ahead(one).burst
    assert not burst_of_one.answered
    several = [delivery(idem.message(token)) for token in ("a", "b")]
    middleware.on_receive(idem.broker, several)
    assert all(sent_ahead(proxy).burst.answered for proxy in several)
    assert not burst_of_one.answered  # its reply was read on the way, and kept for it
    for proxy in (one, *several):
        run(idem, proxy)
    assert burst_of_one.answered  # by its job
    assert [kind for kind, _ in calls] == ["ahead", "ahead"]  # every job started on its answer
    assert [idem.state(token) for token in ("one", "a", "b")] == ["done"] * 3


def test_a_store_down_at_receipt_leaves_each_claim_to_the_job_and_pauses_the_claims_ahead():
    """The burst's call fails: each job claims again at its start (and is deferred, the store
    being down), as the owner it had; the next bursts make no call until the pause is over."""
    down = Setup(RedisStore("redis://127.0.0.1:1/0", socket_timeout=0.2))
    first, second = delivery(down.message("first")), delivery(down.message("second"))
    down.middleware.on_receive(down.broker, [first])
    assert sent_ahead(first).claim is None
    down.middleware.on_receive(down.broker, [second])
    assert second.claim_ahead is None  # within the pause: not asked at receipt
    for proxy in (first, second):
        with pytest.raises(SkipMessage, match="store_unavailable"):
            down.middleware.before_process_message(down.broker, proxy)
    assert [copy.options["idempotency_store_waits"] for copy in down.deferred()] == [1, 1]


def test_an_unexpected_error_at_receipt_leaves_the_claim_to_the_job_as_the_same_owner(idem):
    """A reply the backend cannot read (here: it raises) says nothing of whether the claim was
    granted: the job claims again at its start, as the owner it had, and runs once on that claim."""
    middleware = idem.middleware
    calls = counted_calls(middleware)
    send_claims = middleware.backend.send_claims

    def broken(requests: list[Any]) -> Any:
        reply = send_claims(requests)

        def read() -> list[Any]:
            reply()  # granted in the store, but the answer is lost
            raise ValueError("malformed reply")

        return read

    middleware.backend.send_claims = broken
    proxy = delivery(idem.message("lost"))
    middleware.on_receive(idem.broker, [proxy])
    assert sent_ahead(proxy).claim is None
    run(idem, proxy)
    (ahead, start) = [(kind, [r.owner for r in requests]) for kind, requests in calls]
    assert ahead[0] == "ahead" and start == ("start", ahead[1])  # the same owner: granted, not held
    assert idem.state("lost") == "done" and not idem.deferred()


def test_a_wait_for_an_answer_is_bounded_and_can_be_repeated():
    go_on = threading.Event()

    def doubled(items: list[int]) -> list[int]:
        go_on.wait(10)
        return [i * 2 for i in items]

    coalescer: Coalescer[int, int] = Coalescer(doubled)
    pending = coalescer.submit(21)
    with pytest.raises(TimeoutError):
        coalescer.wait(pending, 0.05)
    go_on.set()
    assert coalescer.wait(pending, 10) == coalescer.wait(pending) == 42


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


def test_a_granted_claim_sent_ahead_is_trusted_for_a_third_of_its_lease(idem, monkeypatch):
    """However long a delivery waited prefetched, its granted claim holds its lease: it is used as
    it is while a third of the lease (10 s here) has not passed and the store answered a claim in
    the last 0.1 s, and made again otherwise."""
    middleware = idem.middleware
    batches = counted_calls(middleware)
    answer, silent = middleware.ahead.answer, [0.0]

    def answer_after_silence(ahead: Any) -> Any:
        # The store's last answer set just before the check: a loaded machine can take 0.1 s
        # between the receipt and the job's start, which the silence would then include.
        middleware.ahead.store_answered_at = time.monotonic() - silent[0]
        return answer(ahead)

    monkeypatch.setattr(middleware.ahead, "answer", answer_after_silence)
    for token, waited_s, silent_s, claims in (
        ("waited", 2.0, 0.0, 1),
        ("stale", 4.0, 0.0, 2),
        ("store silent", 2.0, 1.0, 2),
    ):
        batches.clear()
        proxy = delivery(idem.message(token))
        middleware.on_receive(idem.broker, [proxy])
        granted = sent_ahead(proxy).claim
        assert granted is not None and granted.status == "claimed"  # the answer read
        sent_ahead(proxy).burst.sent_at -= waited_s  # as if it had waited that long in the prefetch
        silent[0] = silent_s  # as if the store had said nothing since
        run(idem, proxy)
        assert idem.state(token) == "done"
        assert len(batches) == claims, (token, batches)


def test_claim_owners_are_unique_and_a_forked_child_draws_its_own_token():
    import os

    from jobsystem.runtime.leases import new_owner

    owners = {new_owner() for _ in range(1000)}
    assert len(owners) == 1000
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report one owner and leave at once
        os.write(write, new_owner().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read, 200).decode()
    assert child and child[:20] not in {owner[:20] for owner in owners}


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
