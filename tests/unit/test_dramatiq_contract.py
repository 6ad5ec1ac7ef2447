"""The parts of Dramatiq the project relies on (``jobsystem.dramatiq_internals``) are there and
behave as relied on: a Dramatiq upgrade that changes one fails here, not in a job in production."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import dramatiq
import pytest
from dramatiq import Message, Worker
from dramatiq.broker import MessageProxy
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import Middleware, MiddlewareError, SkipMessage

from jobsystem import dramatiq_internals as internals
from jobsystem.dramatiq_contract import DramatiqContractError, check_contract
from jobsystem.dramatiq_internals import (
    FlagsNotHonoured,
    ProjectMessage,
    dead_letter_error,
    dead_letter_reason,
    pending_follow_up,
    reject,
    request_redelivery,
    wants_redelivery,
)
from jobsystem.runtime.follow_ups import RetryFollowUp
from middleware.retries import SafeRetries


def message(**options: Any) -> Message[Any]:
    return Message(queue_name="q", actor_name="job", args=(1,), kwargs={}, options=options)


def test_every_part_relied_on_is_there():
    check_contract()


@pytest.mark.parametrize(
    ("owner", "name", "named"),
    [
        (Worker, "_add_worker", "Worker._add_worker"),
        (RabbitmqBroker, "_declare_xq_queue", "_declare_xq_queue"),
        (RabbitmqBroker, "consumer_class", "consumer_class"),
    ],
)
def test_a_part_gone_in_an_upgrade_fails_the_contract_naming_it(monkeypatch, owner, name, named):
    monkeypatch.delattr(owner, name)
    with pytest.raises(DramatiqContractError, match=named):
        check_contract()


def test_a_changed_signature_fails_the_contract_naming_it(monkeypatch):
    def renamed(self, broker, queue_name, prefetch, timeout_ms): ...

    monkeypatch.setattr(internals.RabbitmqConsumer, "__init__", renamed)
    with pytest.raises(DramatiqContractError, match=r"_RabbitmqConsumer.__init__\(broker, queue_name"):
        check_contract()


class _Raises(Middleware):
    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.after_calls = 0

    def before_enqueue(self, broker, message, delay):
        raise self.error

    def after_enqueue(self, broker, message, delay):
        self.after_calls += 1
        raise self.error


def test_emit_before_swallows_all_but_middleware_errors_and_emit_after_swallows_everything():
    # Why every guarding middleware fails closed by construction (middleware.guard).
    accident = _Raises(RuntimeError("a bug"))
    broker = StubBroker(middleware=[accident])
    broker.emit_before("enqueue", message(), None)  # swallowed: the send would go on unguarded
    broker.emit_after("enqueue", message(), None)
    assert accident.after_calls == 1
    deliberate = StubBroker(middleware=[_Raises(MiddlewareError("refused"))])
    with pytest.raises(MiddlewareError):
        deliberate.emit_before("enqueue", message(), None)
    deliberate.emit_after("enqueue", message(), None)  # swallowed too


def test_after_skip_message_runs_while_the_skip_is_being_handled():
    # RateLimits reads the actor's RateLimited from sys.exc_info() in after_skip_message.
    seen: list[BaseException | None] = []

    class Observer(Middleware):
        def after_skip_message(self, broker, message):
            seen.append(sys.exc_info()[1])

    broker = StubBroker(middleware=[Observer()])

    @dramatiq.actor(broker=broker)
    def skipped() -> None:
        raise SkipMessage("not now")

    skipped.send()
    worker = Worker(broker, worker_timeout=50)
    worker.start()
    try:
        broker.join(skipped.queue_name)
        worker.join()
    finally:
        worker.stop()
    assert len(seen) == 1 and isinstance(seen[0], SkipMessage)


def test_retries_publish_the_retry_through_the_brokers_enqueue():
    # SafeRetries hands Retries a broker that records the retry it enqueues.
    broker = StubBroker()
    dramatiq.actor(broker=broker, actor_name="job", queue_name="q")(lambda: None)
    proxy = ProjectMessage(False, 1, message())
    SafeRetries(max_retries=3, min_backoff=10, max_backoff=20).after_process_message(
        broker, proxy, exception=RuntimeError("failed")
    )
    assert len(broker.queues["q.DQ"].queue) == 1 and not wants_redelivery(proxy)


def test_a_retry_rabbitmq_refuses_is_held_for_redelivery_with_the_retry_decided():
    class Refusing(StubBroker):
        def enqueue(self, message, *, delay=None):
            raise dramatiq.errors.ConnectionClosed(RuntimeError("refused"))  # type: ignore[no-untyped-call]

    broker = Refusing()
    dramatiq.actor(broker=broker, actor_name="job", queue_name="q")(lambda: None)
    proxy = ProjectMessage(False, 1, message())
    SafeRetries(max_retries=3, min_backoff=10, max_backoff=20).after_process_message(
        broker, proxy, exception=RuntimeError("failed")
    )
    follow_up = pending_follow_up(proxy)
    assert isinstance(follow_up, RetryFollowUp) and follow_up.message.options["retries"] == 1


def test_flags_set_on_a_message_another_consumer_delivered_raise():
    plain = MessageProxy(message())
    with pytest.raises(FlagsNotHonoured):
        request_redelivery(plain)
    with pytest.raises(FlagsNotHonoured):
        reject(plain, "rejected")
    assert not plain.failed  # nothing half done
    assert not wants_redelivery(plain) and dead_letter_reason(plain) is None  # reading is harmless


def test_the_project_consumers_messages_carry_the_flags():
    proxy = ProjectMessage(True, 42, message())
    assert (proxy.tag, proxy.redelivered, proxy.message.actor_name) == (42, True, "job")
    error = ValueError("bad key")
    reject(proxy, "rejected", error=error)
    assert proxy.failed and dead_letter_reason(proxy) == "rejected" and dead_letter_error(proxy) is error
    request_redelivery(proxy)
    assert wants_redelivery(proxy) and pending_follow_up(proxy) is None


def test_the_topology_hooks_route_dramatiqs_private_steps_to_public_ones():
    calls: list[str] = []

    class Topology(internals.RabbitmqTopology):
        def queue_arguments(self, queue_name):
            calls.append(f"arguments {queue_name}")
            return {"x-custom": 1}

        def declare_work_queue(self, queue_name):
            calls.append(f"work {queue_name}")

        def declare_delay_queue(self, queue_name):
            calls.append(f"delay {queue_name}")

        def declare_dead_letter_queue(self, queue_name):
            calls.append(f"dead {queue_name}")

    broker = Topology(url="amqp://127.0.0.1:1/")  # connects on first use only
    broker.declare_queue("jobs", ensure=True)
    assert calls == ["work jobs", "delay jobs", "dead jobs"]
    assert broker._build_queue_arguments("jobs") == {"x-custom": 1}


def test_a_delivery_holds_its_messages_fields_as_they_are():
    """ProjectMessage copies the message's fields onto itself once (read past
    ``MessageProxy.__getattr__``): right only while a Message is a frozen dataclass without slots."""
    message: Message[Any] = Message(
        queue_name="q", actor_name="a", args=(1,), kwargs={"k": 2}, options={"o": 3}
    )
    delivery = ProjectMessage(False, 7, message)
    assert dataclasses.is_dataclass(Message) and Message.__dataclass_params__.frozen  # type: ignore[attr-defined]
    for field in dataclasses.fields(Message):
        assert getattr(delivery, field.name) is getattr(message, field.name)
    delivery.options["later"] = True  # the same options: a middleware's note is the message's
    assert message.options["later"] is True and delivery.message is message


def test_quick_pipelines_pipe_as_dramatiqs_and_leave_a_message_in_no_pipeline_alone():
    from middleware.pipelines import QuickPipelines
    from tests.unit.stub import RecordingBroker, delivery

    pipelines = QuickPipelines()
    broker = RecordingBroker(middleware=[pipelines])
    first = dramatiq.actor(broker=broker, actor_name="first", queue_name="q")(lambda: 1)
    second = dramatiq.actor(broker=broker, actor_name="second", queue_name="q")(lambda x: x)
    piped = dramatiq.pipeline([first.message(), second.message_with_options()]).messages[0]
    pipelines.after_process_message(broker, delivery(first.message()), result=1)
    pipelines.after_process_message(broker, delivery(piped), result=None, exception=ValueError("x"))
    assert broker.enqueued == []
    pipelines.after_process_message(broker, delivery(piped), result=7)
    ((next_message, delay),) = broker.enqueued
    assert next_message.actor_name == "second" and next_message.args == (7,) and delay is None
    broker.close()
