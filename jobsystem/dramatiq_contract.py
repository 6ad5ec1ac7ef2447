"""Checks that every part of Dramatiq reached for in :mod:`jobsystem.dramatiq_internals` is still
there and shaped as relied on: ``check_contract`` (run by ``tests/unit/test_dramatiq_contract.py``)
names each part a Dramatiq upgrade took away or changed, so the upgrade fails there and not in a job.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from collections.abc import Callable
from typing import Any

from dramatiq import Message
from dramatiq.broker import MessageProxy
from dramatiq.brokers.rabbitmq import RabbitmqBroker, _RabbitmqConsumer, _RabbitmqMessage
from dramatiq.compat import StreamablePipe
from dramatiq.errors import DecodeError
from dramatiq.middleware import Pipelines
from dramatiq.middleware.threading import Interrupt, raise_thread_exception
from dramatiq.worker import ConsumerThread, Worker

from jobsystem.dramatiq_internals import (
    ACTOR_ARGUMENTS_FORMAT,
    RESULTS_MISSING_WARNING,
    UNDEFINED_ACTOR_FORMAT,
    stored_exception,
)
from jobsystem.runtime.message_shape import FIELDS

__all__ = ["EXPECTATIONS", "DramatiqContractError", "check_contract"]


class DramatiqContractError(AssertionError):
    """The installed Dramatiq lacks or changed a part this module relies on (named in the message)."""


def _parameters(function: Any) -> list[str]:
    return list(inspect.signature(function).parameters)


def _source(code: Any) -> str:
    return inspect.getsource(code)


def _says(module: Any, text: str) -> bool:
    """Whether ``module``'s source holds ``text``, in one string literal or in several joined."""
    source = _source(module)
    return text in source or text in re.sub(r'(?<=[^"])"\s*\n\s*"(?=[^"])', "", source)


def _sets(function: Any, *attributes: str) -> bool:
    return all(re.search(rf"self\.{a}\b[^=\n]*=", _source(function)) for a in attributes)


def _new_message() -> Message[Any]:
    return Message(queue_name="q", actor_name="a", args=(), kwargs={}, options={})


def _rabbitmq_message_keeps_its_delivery() -> bool:
    message = _new_message()
    probe = _RabbitmqMessage(True, 7, message)  # type: ignore[no-untyped-call]
    return bool(probe._tag == 7 and probe.redelivered is True and probe._message is message)


def _proxy_keeps_its_exception() -> bool:
    message, error = _new_message(), ValueError("x")
    probe = MessageProxy(message)
    probe.stuff_exception(error)
    return stored_exception(probe) is error and probe._message is message


def _broker_declares_queues_through_its_private_steps() -> bool:
    steps = ("_declare_queue", "_declare_dq_queue", "_declare_xq_queue")
    return all(f"self.{step}(" in _source(RabbitmqBroker._ensure_queue) for step in steps) and all(
        _parameters(getattr(RabbitmqBroker, name)) == ["self", "queue_name"]
        for name in (*steps, "_build_queue_arguments")
    )


def _message_is_its_fields() -> bool:
    message: Message[Any] = Message(queue_name="q", actor_name="a", args=[1], kwargs={}, options={})  # type: ignore[arg-type]
    names = tuple(f.name for f in dataclasses.fields(Message))
    post_init = _source(Message.__post_init__)
    return bool(
        names == FIELDS
        and tuple(vars(message)) == FIELDS
        and message.args == (1,)
        and post_init.count("object.__setattr__") == 1
        and '"args"' in post_init
    )


def _broker_keeps_a_connection_per_thread() -> bool:
    connection = _source(inspect.getattr_static(RabbitmqBroker, "connection").fget)
    channel = _source(inspect.getattr_static(RabbitmqBroker, "channel").fget)
    opens = (
        "self.state.connection",
        "BlockingConnection(parameters=self.parameters)",
        "self.connections.add",
    )
    channels = (
        "self.state.channel",
        "self.connection.channel()",
        "self.confirm_delivery",
        "self.channels.add",
    )
    return (
        all(p in connection for p in opens)
        and all(p in channel for p in channels)
        and "chain(self.channels, self.connections)" in _source(RabbitmqBroker.close)
    )


def _deletable(*names: str) -> bool:
    return all(getattr(inspect.getattr_static(RabbitmqBroker, n), "fdel", None) is not None for n in names)


#: What the project relies on, each with a check that holds while it is true.
EXPECTATIONS: tuple[tuple[str, Callable[[], bool]], ...] = (
    (
        "_RabbitmqConsumer.__init__(broker, queue_name, prefetch, timeout)",
        lambda: (
            _parameters(_RabbitmqConsumer.__init__) == ["self", "broker", "queue_name", "prefetch", "timeout"]
        ),
    ),
    (
        "_RabbitmqConsumer.__init__ sets broker, queue_name, connection, channel, iterator, known_tags",
        lambda: _sets(
            _RabbitmqConsumer.__init__,
            "broker",
            "queue_name",
            "connection",
            "channel",
            "iterator",
            "known_tags",
        ),
    ),
    (
        "_RabbitmqConsumer.__next__ takes next(self.iterator)",
        lambda: "next(self.iterator)" in _source(_RabbitmqConsumer.__next__),
    ),
    (
        "_RabbitmqConsumer.ack and .nack settle message._tag, one of known_tags",
        lambda: all(
            "self.known_tags.remove(message._tag)" in _source(m)
            for m in (_RabbitmqConsumer.ack, _RabbitmqConsumer.nack)
        ),
    ),
    (
        "_RabbitmqMessage(redelivered, tag, message) keeps _tag, redelivered and _message",
        _rabbitmq_message_keeps_its_delivery,
    ),
    ("MessageProxy._exception holds what stuff_exception stored", _proxy_keeps_its_exception),
    (
        "RabbitmqBroker.consumer_class, a property",
        lambda: isinstance(inspect.getattr_static(RabbitmqBroker, "consumer_class"), property),
    ),
    ("RabbitmqBroker.channel and .connection, deletable", lambda: _deletable("channel", "connection")),
    (
        "del RabbitmqBroker.connection closes the calling thread's own (self.state.connection), if any",
        lambda: "self.state.connection" in _source(inspect.getattr_static(RabbitmqBroker, "connection").fdel),
    ),
    (
        "RabbitmqBroker.connection and .channel open one per thread into self.state, each noted in "
        "self.connections / self.channels, and close() closes what those hold (ThreadConnections "
        "closes the same itself, under a lock, each in a bounded time)",
        _broker_keeps_a_connection_per_thread,
    ),
    ("RabbitmqBroker.queues_pending", lambda: _sets(RabbitmqBroker.__init__, "queues_pending")),
    (
        "RabbitmqBroker._ensure_queue declares through _declare_queue, _declare_dq_queue and "
        "_declare_xq_queue(queue_name), arguments from _build_queue_arguments(queue_name)",
        _broker_declares_queues_through_its_private_steps,
    ),
    ("Worker._add_worker()", lambda: _parameters(Worker._add_worker) == ["self"]),
    (
        "Worker.queue_prefetch, the prefetch _add_consumer gives each queue's consumer",
        lambda: (
            _sets(Worker.__init__, "queue_prefetch")
            and "self.queue_prefetch" in _source(Worker._add_consumer)
        ),
    ),
    (
        "Worker.workers, .consumers and .consumer_whitelist",
        lambda: _sets(Worker.__init__, "workers", "consumers", "consumer_whitelist"),
    ),
    (
        "ConsumerThread(broker, queue_name, prefetch, work_queue, worker_timeout) keeps them and .running",
        lambda: (
            {"broker", "queue_name", "prefetch", "work_queue", "worker_timeout"}
            <= set(_parameters(ConsumerThread.__init__))
            and _sets(
                ConsumerThread.__init__, "broker", "prefetch", "work_queue", "worker_timeout", "running"
            )
        ),
    ),
    ("dramatiq.compat.StreamablePipe", lambda: inspect.isclass(StreamablePipe)),
    (
        "dramatiq.middleware.threading.raise_thread_exception(thread_id, exception); Interrupt is "
        "a BaseException",
        lambda: (
            _parameters(raise_thread_exception) == ["thread_id", "exception"]
            and issubclass(Interrupt, BaseException)
            and not issubclass(Interrupt, Exception)
        ),
    ),
    (
        'Pipelines.after_process_message pipes only a message with message.options.get("pipe_target")',
        lambda: 'message.options.get("pipe_target")' in _source(Pipelines.after_process_message),
    ),
    (
        "Message: a dataclass of exactly message_shape.FIELDS in its __dict__, whose __post_init__ only "
        "makes args a tuple (message_shape builds one without __init__)",
        _message_is_its_fields,
    ),
    ("DecodeError(message, data, error) keeps .data", lambda: DecodeError("m", b"d", None).data == b"d"),  # type: ignore[no-untyped-call]
    (
        f"Actor.__call__ logs {ACTOR_ARGUMENTS_FORMAT!r}",
        lambda: _says(importlib.import_module("dramatiq.actor"), ACTOR_ARGUMENTS_FORMAT),
    ),
    (
        f"the worker warns {RESULTS_MISSING_WARNING!r}",
        lambda: _says(importlib.import_module("dramatiq.worker"), RESULTS_MISSING_WARNING),
    ),
    (
        f"the consumer logs {UNDEFINED_ACTOR_FORMAT!r}",
        lambda: _says(importlib.import_module("dramatiq.worker"), UNDEFINED_ACTOR_FORMAT),
    ),
)


def check_contract() -> None:
    """Raise :class:`DramatiqContractError` naming every part of Dramatiq relied on that is gone or
    changed in the installed version."""
    broken = []
    for what, holds in EXPECTATIONS:
        try:
            ok = holds()
        except Exception as exc:  # a missing name, a changed signature
            ok, what = False, f"{what} ({type(exc).__name__}: {exc})"
        if not ok:
            broken.append(what)
    if broken:
        raise DramatiqContractError("Dramatiq changed: " + "; ".join(broken))
