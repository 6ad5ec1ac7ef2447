"""FailClosed: a guarding middleware whose hook raises by accident defers the message (run side),
refuses the send (send side), or makes sure the message is not lost (after hooks)."""

from __future__ import annotations

from typing import Any

import dramatiq
import pytest
from dramatiq.middleware import MiddlewareError, SkipMessage

from jobsystem.dramatiq_internals import wants_redelivery
from middleware.guard import FailClosed, GuardError
from tests.unit.stub import RecordingBroker, delivery


class Broken(FailClosed):
    """Every hook raises what it is told to; ``after_hook_failed`` too, when asked."""

    defer_option = "broken_waits"

    def __init__(self, error: BaseException, *, rescue_fails: bool = False) -> None:
        self.error = error
        self.rescue_fails = rescue_fails
        self.rescued: list[str] = []

    def before_process_message(self, broker: Any, message: Any) -> None:
        raise self.error

    def before_enqueue(self, broker: Any, message: Any, delay: Any) -> None:
        raise self.error

    def after_process_message(
        self, broker: Any, message: Any, *, result: Any = None, exception: Any = None
    ) -> None:
        raise self.error

    def on_receive(self, broker: Any, message: Any) -> None:
        raise self.error

    def after_hook_failed(self, broker: Any, message: Any, hook: str) -> None:
        self.rescued.append(hook)
        if self.rescue_fails:
            raise RuntimeError("the rescue failed too")


class BrokenRun(FailClosed):
    """Only its check before the run raises (its re-enqueue of the message goes through)."""

    defer_option = "broken_waits"

    def before_process_message(self, broker: Any, message: Any) -> None:
        raise KeyError("a bug")


def setup(guard: FailClosed) -> tuple[RecordingBroker, Any]:
    broker = RecordingBroker(middleware=[guard])
    actor = dramatiq.actor(broker=broker, actor_name="job", queue_name="q")(lambda: None)
    return broker, actor


def test_an_unexpected_error_before_the_run_defers_the_message_with_a_growing_delay():
    guard = BrokenRun()
    broker, actor = setup(guard)
    message = actor.message().copy(options={"retries": 1})
    delays: list[int] = []
    for _ in range(3):
        with pytest.raises(SkipMessage, match="guard_failed"):
            guard.before_process_message(broker, delivery(message))
        message, delay = broker.enqueued[-1]
        assert delay is not None  # deferred: enqueued again with a delay
        delays.append(delay)
    assert message.options["broken_waits"] == 3 and message.options["retries"] == 1  # no retry spent
    assert 2_000 <= delays[0] < delays[1] < delays[2] <= 60_000


def test_deliberate_answers_pass_through_unchanged():
    broker, actor = setup(Broken(SkipMessage("a duplicate")))
    with pytest.raises(SkipMessage, match="a duplicate"):
        broker.middleware[0].before_process_message(broker, delivery(actor.message()))
    assert broker.enqueued == []  # skipped, not deferred


def test_an_unexpected_error_at_send_refuses_the_send():
    guard = Broken(ValueError("a bug"))
    broker, actor = setup(guard)
    with pytest.raises(GuardError, match="could not check the send"):
        guard.before_enqueue(broker, actor.message(), None)


def test_a_guard_names_its_own_send_error():
    class Refused(MiddlewareError):
        pass

    class Strict(Broken):
        send_error = Refused

    guard = Strict(ValueError("a bug"))
    broker, actor = setup(guard)
    with pytest.raises(Refused):
        guard.before_enqueue(broker, actor.message(), None)


def test_an_after_hook_that_fails_is_rescued_and_a_failed_rescue_requeues_the_delivery():
    guard = Broken(RuntimeError("a bug"))
    broker, actor = setup(guard)
    proxy = delivery(actor.message())
    guard.after_process_message(broker, proxy)
    assert guard.rescued == ["after_process_message"] and not wants_redelivery(proxy)
    hopeless = Broken(RuntimeError("a bug"), rescue_fails=True)
    proxy = delivery(actor.message())
    hopeless.after_process_message(broker, proxy)
    assert wants_redelivery(proxy)  # put back, not acked


def test_an_error_on_receipt_is_logged_and_the_consumer_goes_on(caplog):
    guard = Broken(RuntimeError("a bug"))
    broker, actor = setup(guard)
    guard.on_receive(broker, delivery(actor.message()))
    assert "guard_failed" in caplog.text
