"""The dispatch gate hands a delivery on exactly once, after its receiver and every hold let go;
the coalescer's callbacks that drive it run once each answer is in, error or not; and a held
delivery the consumer does not hand on (closed, or its hand-off failed) goes to the drop hooks."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobsystem.rabbitmq.consumer import DeadLetteringConsumer
from jobsystem.runtime.claims_ahead import ClaimsAhead
from jobsystem.runtime.coalesce import Coalescer
from jobsystem.runtime.dispatch_gate import DispatchGate
from jobsystem.store.idempotency import ClaimRequest


def counting_gate() -> tuple[DispatchGate, list[int]]:
    calls: list[int] = []
    return DispatchGate(lambda: calls.append(1)), calls


def test_a_delivery_nothing_held_is_handed_on_by_its_receiver():
    gate, calls = counting_gate()
    assert gate.close() is True
    assert calls == []


def test_a_held_delivery_is_handed_on_by_the_last_release_only():
    gate, calls = counting_gate()
    first, second = gate.hold(), gate.hold()
    assert gate.close() is False
    first()
    first()  # a second call of the same release counts once
    assert calls == []
    second()
    assert calls == [1]


def test_holds_released_before_the_receiver_lets_go_leave_it_to_the_receiver():
    gate, calls = counting_gate()
    gate.hold()()
    assert gate.close() is True
    assert calls == []


@given(st.lists(st.booleans(), max_size=6), st.integers(min_value=0, max_value=6))
def test_the_delivery_is_handed_on_exactly_once_whatever_the_order(releases_early, close_after):
    """Holds released from other threads, some before the receiver closes: exactly one hand-on,
    by the receiver (close says True) or by a release, never both."""
    gate, calls = counting_gate()
    releases = [gate.hold() for _ in releases_early]
    early = [r for r, now in zip(releases, releases_early, strict=True) if now]
    late = [r for r, now in zip(releases, releases_early, strict=True) if not now]
    threads = [threading.Thread(target=r) for r in early[:close_after]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for release in early[close_after:]:
        release()
    by_receiver = gate.close()
    for release in late:
        release()
    assert len(calls) + by_receiver == 1


def test_the_coalescer_calls_back_once_the_answer_or_the_error_is_in():
    def doubled(items: list[int]) -> list[int]:
        if 13 in items:
            raise RuntimeError("store down")
        return [i * 2 for i in items]

    coalescer: Coalescer[int, int] = Coalescer(doubled)
    seen: list[Any] = []
    done = threading.Event()

    def note(pending: Any) -> None:
        try:
            seen.append(coalescer.wait(pending, timeout=0))  # in already when called back
        except RuntimeError as exc:
            seen.append(str(exc))
        done.set()

    for item in (21, 13):
        done.clear()
        box: list[Any] = []
        box.append(coalescer.submit(item, on_done=lambda box=box: note(box[0])))
        assert done.wait(10)
    assert seen == [42, "store down"]


def test_a_failing_callback_does_not_stop_the_coalescer(caplog: pytest.LogCaptureFixture):
    coalescer: Coalescer[int, int] = Coalescer(lambda items: items)

    def broken() -> None:
        raise ValueError("bug")

    assert coalescer.wait(coalescer.submit(1, on_done=broken), timeout=10) == 1
    assert coalescer.call(2) == 2  # a later batch: the pump called back for the first one before
    assert "coalescer_callback_failed" in caplog.messages


def test_a_claim_that_cannot_be_sent_lets_its_delivery_go():
    """If the hand-off to the claims' pump raised, a hold kept would strand the delivery."""

    class Refusing(Coalescer[ClaimRequest, Any]):
        def submit(self, item: ClaimRequest, on_done: Any = None) -> Any:
            raise RuntimeError("no pump")

    ahead = ClaimsAhead(Refusing(lambda items: items), lease_ms=30_000)
    gate, calls = counting_gate()
    with pytest.raises(RuntimeError):
        ahead.send(object(), ClaimRequest("k", "m", "o", 30_000, 60_000), gate)  # type: ignore[arg-type]
    assert gate.close() is True and calls == []  # the receiver hands it on itself


def dropping_consumer(*, closed: bool, dispatch: Any) -> tuple[Any, list[str]]:
    """A consumer's state as ``_dispatch_held`` reads it, with a drop hook that notes each delivery."""
    dropped: list[str] = []
    consumer = SimpleNamespace(
        closed=closed,
        dispatch=dispatch,
        broker=object(),
        drop_hooks=[lambda broker, message: dropped.append(message.message_id)],
    )
    consumer._dropped = lambda message: DeadLetteringConsumer._dropped(consumer, message)  # type: ignore[arg-type]
    return consumer, dropped


@pytest.mark.parametrize("how", ["closed", "dispatch failed"])
def test_a_held_delivery_that_is_not_handed_on_goes_to_the_drop_hooks(how: str):
    def failing(message: Any) -> None:
        raise RuntimeError("work queue gone")

    handed_on: list[str] = []
    consumer, dropped = dropping_consumer(
        closed=how == "closed", dispatch=failing if how == "dispatch failed" else handed_on.append
    )
    DeadLetteringConsumer._dispatch_held(consumer, SimpleNamespace(message_id="m-1"))  # type: ignore[arg-type]
    assert dropped == ["m-1"] and handed_on == []


def test_a_held_delivery_handed_on_is_not_dropped():
    handed_on: list[Any] = []
    consumer, dropped = dropping_consumer(closed=False, dispatch=handed_on.append)
    DeadLetteringConsumer._dispatch_held(consumer, SimpleNamespace(message_id="m-1"))  # type: ignore[arg-type]
    assert [m.message_id for m in handed_on] == ["m-1"] and dropped == []
