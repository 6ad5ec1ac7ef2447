"""Claims made at receipt (sent ahead of the job's start): a burst's claims in one store call, used
or given back, trusted for a while, left to the job when the store is down or errs; the
coalescer's bounded wait and the claims' owners."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from dramatiq.middleware import SkipMessage

from jobsystem.runtime import claims_ahead
from jobsystem.runtime.coalesce import Coalescer
from jobsystem.store.base import StateStore
from jobsystem.store.redis import RedisStore
from middleware.idempotency import Idempotency
from tests.unit.idempotency_setup import Setup, run, sent_ahead, set_up
from tests.unit.stub import delivery


@pytest.fixture
def idem(store: StateStore) -> Iterator[Setup]:
    yield from set_up(store)


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
