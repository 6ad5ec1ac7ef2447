"""Every private or undocumented part of Dramatiq the project relies on, in one place, with why.

Dramatiq 2.2 has no public way to change the RabbitMQ topology, to dead-letter a message with its
final record, to replace a dead worker thread, to close one thread's RabbitMQ connection (or a dead
thread's), to close the broker while threads open theirs, or to tell a ``dramatiq`` worker process
apart.
The project reaches for these names through this module only; ``check_contract`` in
:mod:`jobsystem.dramatiq_contract` (run by ``tests/unit/test_dramatiq_contract.py``) checks each
one is still there and shaped as relied on, and ``pyproject.toml`` pins Dramatiq to the minor
version it was checked on.

It also holds the flags a middleware sets on a message for the project's consumer to act on
(:class:`ProjectMessage`): setting one on a message another consumer delivered raises
:class:`FlagsNotHonoured`, since that consumer would ignore it (and ack a message meant to be
requeued).
"""

from __future__ import annotations

import threading
from typing import Any

from dramatiq import Message
from dramatiq.broker import MessageProxy
from dramatiq.brokers.rabbitmq import RabbitmqBroker, _RabbitmqConsumer, _RabbitmqMessage
from dramatiq.compat import StreamablePipe
from dramatiq.middleware.threading import Interrupt, raise_thread_exception
from dramatiq.worker import ConsumerThread, Worker

from jobsystem.runtime.closing import BoundedCloses, close_quietly, connection_closes
from jobsystem.runtime.connecting import open_connection
from jobsystem.runtime.follow_ups import DeadLetterFollowUp, FollowUp, RetryFollowUp

__all__ = [
    "ACTOR_ARGUMENTS_FORMAT",
    "RESULTS_MISSING_WARNING",
    "UNDEFINED_ACTOR_FORMAT",
    "ConsumerThread",
    "FlagsNotHonoured",
    "Interrupt",
    "ProjectMessage",
    "RabbitmqConsumer",
    "RabbitmqTopology",
    "StreamablePipe",
    "ThreadConnections",
    "add_worker_thread",
    "close_ended_threads_connections",
    "dead_letter_error",
    "dead_letter_reason",
    "mark_dead_lettered",
    "pending_follow_up",
    "project_message",
    "raise_in_thread",
    "reject",
    "release_thread_connection",
    "request_redelivery",
    "send_claim_ahead",
    "stored_exception",
    "take_claim_ahead",
    "wants_redelivery",
]

# -- names -----------------------------------------------------------------------------------------

#: Dramatiq's RabbitMQ consumer. The project's consumer subclasses it to check each body before
#: anything reads it and to publish dead letters itself; it uses the attributes its ``__init__``
#: sets (``broker``, ``queue_name``, ``connection``, ``channel``, ``iterator``, ``known_tags``).
RabbitmqConsumer = _RabbitmqConsumer

#: The ``stderr`` of a process the ``dramatiq`` command started (it pipes output to its parent):
#: how start-up tells a worker process, which must exit quietly on bad settings, from a library use.
StreamablePipe = StreamablePipe

#: Dramatiq's worker and consumer threads: the watchdog replaces a dead one with a new one built
#: from the dead one's ``broker``, ``prefetch``, ``work_queue`` and ``worker_timeout``.
ConsumerThread = ConsumerThread

#: The format of ``Actor.__call__``'s DEBUG record, whose arguments are the job's own (hidden).
ACTOR_ARGUMENTS_FORMAT = "Received args=%r kwargs=%r."

#: The format of the consumer's ERROR record for a message of no registered actor, whose argument
#: (and its exception's message) is the message's actor name: the sender's text.
UNDEFINED_ACTOR_FORMAT = "Received message for undefined actor %r. Moving it to the DLQ."

#: Dramatiq's warning, on every job that returns a value, that no Results middleware keeps it.
RESULTS_MISSING_WARNING = "you haven't added the Results middleware"


def add_worker_thread(worker: Worker) -> None:
    """Start one more worker thread in ``worker`` (``Worker._add_worker``)."""
    worker._add_worker()


def raise_in_thread(thread_id: int, exception: type[BaseException]) -> None:
    """Raise ``exception`` asynchronously in thread ``thread_id``, as Dramatiq's ``TimeLimit`` does
    (``raise_thread_exception``; CPython only, between bytecodes: a blocking C call is not cut).
    ``Interrupt``, the base of such exceptions, is a ``BaseException`` an actor's ``except
    Exception`` does not swallow."""
    raise_thread_exception(thread_id, exception)  # type: ignore[no-untyped-call]


def stored_exception(message: MessageProxy) -> BaseException | None:
    """The exception the worker stored on ``message`` for its last attempt (``_exception``)."""
    exception: BaseException | None = message._exception
    return exception


def release_thread_connection(broker: object) -> None:
    """Close the calling thread's RabbitMQ connection of ``broker`` (and its channel), if it has one.

    Dramatiq's RabbitMQ broker opens one connection per thread (``broker.connection``) and keeps
    every one open until ``broker.close()``: a thread that publishes or declares a queue and then
    ends (a dashboard request thread, a timer) left its connection open for the life of the
    process. Such a thread's broker work ends with this call. Only this thread uses its
    connection, so none is closed under another thread's feet, and its next use opens a new one.
    Deleting the property closes and forgets the channel and the connection, and opens nothing
    (reading ``broker.connection`` would open one). Any other broker (a stub) holds none."""
    if isinstance(broker, RabbitmqBroker):
        del broker.connection


def close_ended_threads_connections(broker: object) -> int:
    """Close the RabbitMQ connections of ``broker``'s threads that ended without closing theirs;
    returns how many. Only a :class:`ThreadConnections` broker knows which thread opened which
    (Dramatiq's own keeps a thread's connection in a thread-local that is gone once the thread
    is): any other broker is left as it is."""
    if isinstance(broker, ThreadConnections):
        return broker.close_ended_threads()
    return 0


class ThreadConnections(RabbitmqBroker):
    """Dramatiq's per-thread connections and channels, each noted with the thread that opened it,
    under a lock that ``close()`` holds while it takes them all.

    Dramatiq keeps a thread's connection and channel in a thread-local (``state``) and all of them
    in the sets ``connections`` and ``channels``. Its ``close()`` walks those sets unguarded: a
    thread opening or closing its own meanwhile raised ``RuntimeError: Set changed size during
    iteration`` and left the rest open (and a worker's shutdown failed). And a thread that ended
    without :func:`release_thread_connection` (a worker thread that died, replaced by the
    watchdog) left its connection open, in the set for the life of the process (and in RabbitMQ
    until it missed two heartbeats): once the thread is gone, nothing told whose it was.

    The network steps (a handshake, a thread closing its own) run outside the lock: a connection
    a thread finishes opening while ``close()`` runs is registered after it, as on a broker used
    after ``close()`` (Dramatiq's opens new connections then). Threads not started through
    ``threading`` (a C library's) always look alive: their connections are closed by ``close()``
    only.

    Every close is waited for a bounded time (:mod:`jobsystem.runtime.closing`, ``closes``): a
    RabbitMQ that stopped answering held a shutdown, or the watchdog, for as long as the socket.
    So a close given up may still run on its helper thread: what it closes was taken from its
    thread first (``close()`` takes every thread's; a thread whose connection or channel is no
    longer the broker's lets it go and opens a new one on its next use), never shared with it.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.connections_lock = threading.Lock()
        #: Each open connection and channel, with the thread that opened it.
        self.owners: dict[Any, threading.Thread] = {}
        #: How this broker's connections are closed (its consumers' too), each in a bounded time.
        self.closes = BoundedCloses()

    @property
    def connection(self) -> Any:
        connection = getattr(self.state, "connection", None)
        if connection is not None and connection not in self.connections:
            self._detached()
            connection = None
        if connection is None:
            connection = open_connection(self.parameters)  # a hung RabbitMQ: AMQPConnectionError
            self.state.connection = connection
            self._register(connection, self.connections)
        return connection

    @connection.deleter
    def connection(self) -> None:
        state = vars(self.state)
        channel, connection = state.pop("channel", None), state.pop("connection", None)
        if not self._forget(channel, connection):  # both at once: close() then touches neither
            return  # close() took them first: a helper thread closes them
        if connection is not None:
            self.closes.run(connection_closes([connection], [channel] if channel is not None else []))
        elif channel is not None:
            close_quietly(channel)

    @property
    def channel(self) -> Any:
        channel = getattr(self.state, "channel", None)
        if channel is not None and channel not in self.channels:
            self._detached()
            channel = None
        if channel is None:
            channel = self.connection.channel()
            if self.confirm_delivery:
                channel.confirm_delivery()
            self.state.channel = channel
            self._register(channel, self.channels)
        return channel

    @channel.deleter
    def channel(self) -> None:
        channel = vars(self.state).pop("channel", None)
        if channel is not None and self._forget(channel):
            close_quietly(channel)

    def _register(self, opened: Any, kept: set[Any]) -> None:
        with self.connections_lock:
            kept.add(opened)
            self.owners[opened] = threading.current_thread()

    def _forget(self, *opened: Any) -> bool:
        """Take ``opened`` out of the broker's sets; False if none of them was in (``close()``
        took them, and closes them)."""
        with self.connections_lock:
            found = False
            for item in opened:
                found = self.owners.pop(item, None) is not None or found
                self.channels.discard(item)
                self.connections.discard(item)
            return found

    def _detached(self) -> None:
        """This thread's connection and channel were taken by ``close()``, whose helper thread may
        still be closing them (pika is not for two threads at once): the thread lets them go, and
        opens new ones on its next use."""
        vars(self.state).pop("channel", None)
        vars(self.state).pop("connection", None)

    def close_ended_threads(self) -> int:
        """Close the connections (and so their channels) of threads that ended; returns how many.
        No other thread uses them: their thread-local went with their thread."""
        with self.connections_lock:
            ended = [item for item, owner in self.owners.items() if not owner.is_alive()]
            connections = [item for item in ended if item in self.connections]
        self._forget(*ended)
        self.closes.run(connection_closes(connections))
        return len(connections)

    def close(self) -> None:
        """Close every channel and connection, as Dramatiq's ``close()`` does; each connection (its
        channels first) on a helper thread, all at once. They are taken from their threads first,
        under the lock (no thread adds or removes one meanwhile): a thread's next use opens a new
        connection, never the one a helper thread may still be closing after the bound."""
        with self.connections_lock:
            connections, channels = list(self.connections), list(self.channels)
            self.connections.clear()
            self.channels.clear()
            self.owners.clear()
        self.closes.run(connection_closes(connections, channels))


class RabbitmqTopology(RabbitmqBroker):
    """Dramatiq's RabbitMQ broker with its private queue-declaration steps under public names.

    ``RabbitmqBroker.declare_queue`` declares a queue, its delay queue and its dead-letter queue
    with ``_declare_queue``, ``_declare_dq_queue`` and ``_declare_xq_queue``, whose arguments come
    from ``_build_queue_arguments``: overriding them is the only way to change the topology. A
    subclass overrides the public methods here instead.
    """

    def queue_arguments(self, queue_name: str) -> dict[str, Any]:
        """The arguments of the work and delay queues of ``queue_name``."""
        arguments: dict[str, Any] = RabbitmqBroker._build_queue_arguments(self, queue_name)  # type: ignore[no-untyped-call]
        return arguments

    def declare_work_queue(self, queue_name: str) -> Any:
        return RabbitmqBroker._declare_queue(self, queue_name)  # type: ignore[no-untyped-call]

    def declare_delay_queue(self, queue_name: str) -> Any:
        return RabbitmqBroker._declare_dq_queue(self, queue_name)  # type: ignore[no-untyped-call]

    def declare_dead_letter_queue(self, queue_name: str) -> Any:
        return RabbitmqBroker._declare_xq_queue(self, queue_name)  # type: ignore[no-untyped-call]

    def _build_queue_arguments(self, queue_name: str) -> dict[str, Any]:
        return self.queue_arguments(queue_name)

    def _declare_queue(self, queue_name: str) -> Any:
        return self.declare_work_queue(queue_name)

    def _declare_dq_queue(self, queue_name: str) -> Any:
        return self.declare_delay_queue(queue_name)

    def _declare_xq_queue(self, queue_name: str) -> Any:
        return self.declare_dead_letter_queue(queue_name)


# -- the messages' flags ---------------------------------------------------------------------------


class FlagsNotHonoured(TypeError):
    """A middleware flagged a message that the project's consumer did not deliver: the consumer
    that did would ignore the flag (the broker is not :class:`~jobsystem.rabbitmq.broker.ProjectBroker`)."""


class ProjectMessage(_RabbitmqMessage):
    """A delivery of the project's consumer, which honours the flags a middleware sets on it.

    Attributes:
      redelivery: requeue the delivery instead of acking it, because what its attempt decided
        could not be published: the follow-up to publish again (a retry or a dead letter), or
        True when none was decided.
      dead_letter_reason: why the message is dead-lettered (set by a middleware that rejects it,
        and by the consumer once the dead letter is safe, for the hooks that log it).
      dead_letter_error: the error a rejecting middleware names as the cause (the dead letter
        records it rather than the ``SkipMessage``).
      claim_ahead: the claim the idempotency middleware made for this delivery at receipt.
      delivered_on: the consumer whose channel delivered it. A delivery tag names a delivery on
        that channel only: a consumer restarted after a lost connection numbers its deliveries
        from 1 again, so an older delivery's tag can name one of the new channel's.
    """

    def __init__(self, redelivered: bool, tag: int, message: Message[Any]) -> None:
        super().__init__(redelivered, tag, message)  # type: ignore[no-untyped-call]
        # Fields read past MessageProxy.__getattr__ (~40 reads a delivery); a Message is frozen.
        self.__dict__.update(vars(message))
        self.redelivery: FollowUp | bool = False
        self.dead_letter_reason: str | None = None
        self.dead_letter_error: BaseException | None = None
        self.claim_ahead: object | None = None
        self.delivered_on: object | None = None

    @property
    def tag(self) -> int:
        """The delivery tag (``_tag``)."""
        tag: int = self._tag
        return tag

    @property
    def message(self) -> Message[Any]:
        """The message delivered (``_message``)."""
        message: Message[Any] = self._message
        return message


def project_message(message: object) -> ProjectMessage:
    """``message`` as the project's consumer delivered it; :class:`FlagsNotHonoured` otherwise."""
    if not isinstance(message, ProjectMessage):
        raise FlagsNotHonoured(
            f"a {type(message).__name__} cannot carry the project's flags: only the project's "
            "consumer (jobsystem.rabbitmq.consumer) acts on them"
        )
    return message


def request_redelivery(message: MessageProxy, follow_up: FollowUp | None = None) -> None:
    """Ask the consumer to requeue ``message`` instead of acking it: its ``follow_up`` (the retry
    or dead letter its attempt decided) was not published."""
    project_message(message).redelivery = follow_up or True


def wants_redelivery(message: object) -> bool:
    return isinstance(message, ProjectMessage) and bool(message.redelivery)


def pending_follow_up(message: object) -> FollowUp | None:
    """The follow-up of ``message`` that could not be published, if one was decided."""
    follow_up = message.redelivery if isinstance(message, ProjectMessage) else None
    return follow_up if isinstance(follow_up, RetryFollowUp | DeadLetterFollowUp) else None


def reject(message: MessageProxy, reason: str, *, error: BaseException | None = None) -> None:
    """Fail ``message`` for good from a middleware, naming the reason its dead letter records and,
    when an error is the cause, that error (its type, scrubbed message and traceback)."""
    flagged = project_message(message)
    flagged.dead_letter_reason = reason
    flagged.dead_letter_error = error
    message.fail()


def mark_dead_lettered(message: MessageProxy, reason: str | None) -> None:
    """The consumer published ``message``'s dead letter, for ``reason``."""
    project_message(message).dead_letter_reason = reason


def send_claim_ahead(message: MessageProxy, claim: object) -> None:
    """Keep what a middleware sent ahead for ``message`` at receipt, until it starts."""
    project_message(message).claim_ahead = claim


def take_claim_ahead(message: object) -> object | None:
    """What was sent ahead for ``message`` (None if nothing), taken off it: it is collected once."""
    if not isinstance(message, ProjectMessage):
        return None
    claim, message.claim_ahead = message.claim_ahead, None
    return claim


def dead_letter_reason(message: object) -> str | None:
    return message.dead_letter_reason if isinstance(message, ProjectMessage) else None


def dead_letter_error(message: object) -> BaseException | None:
    return message.dead_letter_error if isinstance(message, ProjectMessage) else None
