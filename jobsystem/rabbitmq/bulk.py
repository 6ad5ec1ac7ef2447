"""Bulk send: publish many messages with pipelined publisher confirms.

``actor.send()`` with confirms waits for each message's own confirm (~1.4k messages/s here).
:func:`send_bulk` keeps up to ``window`` publishes in flight on one dedicated connection and counts
RabbitMQ's (possibly ``multiple``) acks, so a campaign fan-out of thousands of messages costs one
round trip per window instead of one per message. It returns only when every message is confirmed,
and raises :class:`BulkSendError` naming the messages that were not; the idempotency keys of the
messages not published are given back whatever the failure.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import dramatiq
import pika
import pika.channel
import pika.frame
import pika.spec
from dramatiq import Message
from dramatiq.brokers.rabbitmq import RabbitmqBroker

from middleware.idempotency import as_duplicate

logger = logging.getLogger(__name__)


class BulkSendError(RuntimeError):
    """Some messages of a bulk send were not confirmed by RabbitMQ.

    ``failed`` holds them (nacked, returned as unroutable, or unconfirmed when the connection
    dropped or went silent); ``confirmed`` holds the others. The idempotency keys of ``failed``
    were given back: sending them again (or new messages with their keys) publishes them, and one
    RabbitMQ had after all still runs once (the claim at run).
    """

    def __init__(self, reason: str, failed: list[Message[Any]], confirmed: list[Message[Any]]) -> None:
        ids = ", ".join(m.message_id for m in failed[:5]) + (" ..." if len(failed) > 5 else "")
        super().__init__(
            f"{len(failed)} of {len(failed) + len(confirmed)} messages not confirmed ({reason}): {ids}"
        )
        self.reason = reason
        self.failed = failed
        self.confirmed = confirmed


@dataclass(repr=False)  # pika logs a failed callback with its object: not every message's arguments
class _Publisher:
    """One bulk send's state on one node, driven by pika's asynchronous connection callbacks."""

    messages: list[Message[Any]]
    #: The messages' bodies, encoded before connecting.
    bodies: list[bytes]
    parameters: pika.connection.Parameters
    window: int
    #: The longest wait for a confirm (reset by each one), not a deadline for the whole batch.
    timeout: float
    next_index: int = 0
    published: int = 0
    # delivery tag (1-based publish order on the channel) -> index into messages
    in_flight: dict[int, int] = field(default_factory=dict)
    confirmed: set[int] = field(default_factory=set)
    rejected: set[int] = field(default_factory=set)
    returned_ids: set[str] = field(default_factory=set)
    error: str | None = None
    #: The connection could not be opened (nothing was published): another node may be tried.
    unreachable: bool = False
    progress_at: float = 0.0
    channel: pika.channel.Channel | None = None
    connection: pika.SelectConnection | None = None

    def run(self) -> None:
        """Connect, publish and count the confirms until every message is answered or the send
        fails (``error``); the connection is closed when it returns. A callback that raises fails
        the send, its error named in ``error``, instead of escaping."""
        self.connection = pika.SelectConnection(
            parameters=self.parameters,
            on_open_callback=self._on_connection_open,
            on_open_error_callback=self._on_open_error,
            on_close_callback=self._on_connection_closed,
        )
        self.progress_at = time.monotonic()
        self.connection.ioloop.call_later(self.timeout, self._on_timeout)
        while True:
            try:
                self.connection.ioloop.start()  # until a close (or open error) callback stops it
                return
            except Exception as exc:  # from a callback pika does not guard (a timer's): close, go on
                logger.error("bulk_send_callback_failed", exc_info=True)
                self._fail(f"{type(exc).__name__} while publishing: {exc}")

    def _fail(self, reason: str) -> None:
        if self.error is None:
            self.error = reason
        assert self.connection is not None
        if self.connection.is_closed:
            self.connection.ioloop.stop()
        elif not self.connection.is_closing:
            self.connection.close()  # while opening too: pika then calls _on_open_error

    def _on_timeout(self) -> None:
        assert self.connection is not None
        idle = time.monotonic() - self.progress_at
        if idle < self.timeout:  # confirms came meanwhile: wait from the last one
            self.connection.ioloop.call_later(self.timeout - idle, self._on_timeout)
        else:
            self._fail(f"no confirm within {self.timeout:g} s")

    def _on_open_error(self, connection: pika.SelectConnection, error: BaseException | str) -> None:
        if self.error is None:  # not closed by _fail: the node could not be reached
            self.unreachable = True
            self.error = f"connection failed: {error!r}"  # its str() is often empty
        connection.ioloop.stop()

    def _on_connection_closed(self, connection: pika.SelectConnection, reason: BaseException) -> None:
        if not self._done():
            self.error = self.error or f"connection closed: {reason}"
        connection.ioloop.stop()

    def _on_connection_open(self, connection: pika.SelectConnection) -> None:
        connection.channel(on_open_callback=self._on_channel_open)

    def _on_channel_open(self, channel: pika.channel.Channel) -> None:
        self.channel = channel
        channel.add_on_close_callback(self._on_channel_closed)
        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(ack_nack_callback=self._on_confirm, callback=lambda _frame: self._publish())

    def _on_channel_closed(self, channel: pika.channel.Channel, reason: BaseException) -> None:
        if not self._done():
            self._fail(f"channel closed: {reason}")
        elif self.connection is not None and self.connection.is_open:
            self.connection.close()

    def _on_return(
        self,
        channel: pika.channel.Channel,
        method: pika.spec.Basic.Return,
        properties: pika.spec.BasicProperties,
        body: bytes,
    ) -> None:
        # An unroutable mandatory message is returned, then acked: remember it as failed.
        if properties.message_id:
            self.returned_ids.add(properties.message_id)

    def _publish(self) -> None:
        assert self.channel is not None
        if self.error is not None:  # failed: the connection is closing
            return
        now = int(time.time())  # when the messages become ready, as the broker's publishes say
        while self.next_index < len(self.messages) and len(self.in_flight) < self.window:
            message = self.messages[self.next_index]
            self.channel.basic_publish(
                exchange="",
                routing_key=message.queue_name,
                body=self.bodies[self.next_index],
                properties=pika.BasicProperties(
                    delivery_mode=pika.DeliveryMode.Persistent,
                    priority=message.options.get("broker_priority"),
                    message_id=message.message_id,
                    timestamp=now,
                ),
                mandatory=True,
            )
            self.published += 1
            self.in_flight[self.published] = self.next_index
            self.next_index += 1
        if self._done() and self.channel.is_open:
            self.channel.close()

    def _on_confirm(self, frame: pika.frame.Method) -> None:
        self.progress_at = time.monotonic()
        method = frame.method
        tag = method.delivery_tag
        tags = [t for t in self.in_flight if t <= tag] if method.multiple else [tag]
        target = self.confirmed if isinstance(method, pika.spec.Basic.Ack) else self.rejected
        for t in tags:
            target.add(self.in_flight.pop(t))
        self._publish()

    def _done(self) -> bool:
        return len(self.confirmed) + len(self.rejected) == len(self.messages)


def send_bulk(
    messages: Iterable[Message[Any]],
    *,
    broker: RabbitmqBroker | None = None,
    window: int = 2000,
    timeout: float = 120.0,
) -> list[Message[Any]]:
    """Publish ``messages`` and return them once RabbitMQ has confirmed every one.

    Middleware ``before_enqueue``/``after_enqueue`` hooks run for each message as for ``send()``
    (``after_enqueue`` for each confirmed one, also when others failed); a middleware with a
    ``before_enqueue_batch(broker, messages)`` hook (idempotency) first sees them all at once and
    names the duplicates, which are not published: in the result they are replaced, as ``send()``
    does, by a copy carrying the original message id. Whatever the failure, the middleware's
    ``on_unsent_batch(broker, messages)`` hooks then get the messages not confirmed (idempotency
    gives their keys back, so sending them again publishes them). Each node of the broker's URL
    is tried in turn until one accepts the connection.

    Raises:
      BulkSendError: some messages were nacked, unroutable, or unconfirmed when the connection
        dropped or no confirm came for ``timeout`` seconds; the error lists them.
      Exception: any error before the first publish (a ``before_enqueue`` hook refusing, a body
        that cannot be encoded, a queue that cannot be declared) is raised as it is: nothing was
        published.
    """
    target = broker or dramatiq.get_broker()
    if not isinstance(target, RabbitmqBroker):
        raise TypeError("send_bulk needs a RabbitmqBroker")
    requested = list(messages)
    confirmed: list[Message[Any]] = []
    try:
        duplicates = _register(target, requested)
        pending = [m for m in requested if m.message_id not in duplicates]
        if pending:
            confirmed, reason = _publish(target, pending, window=window, timeout=timeout)
            for message in confirmed:
                target.emit_after("enqueue", message, None)
            if reason is not None:
                raise BulkSendError(reason, _other_than(pending, confirmed), confirmed)
    except BaseException:
        _unsent(target, _other_than(requested, confirmed))
        raise
    return [as_duplicate(m, duplicates[m.message_id]) if m.message_id in duplicates else m for m in requested]


def _register(broker: RabbitmqBroker, messages: list[Message[Any]]) -> dict[str, str]:
    """The ``before_enqueue_batch`` hooks' duplicates: ``{message_id: original_message_id}``."""
    duplicates: dict[str, str] = {}
    for middleware in broker.middleware:
        hook = getattr(middleware, "before_enqueue_batch", None)
        if hook is not None:
            duplicates.update(hook(broker, messages))
    return duplicates


def _publish(
    broker: RabbitmqBroker, pending: list[Message[Any]], *, window: int, timeout: float
) -> tuple[list[Message[Any]], str | None]:
    """Run the ``before_enqueue`` hooks, encode, declare the queues, and publish on the first node
    that accepts a connection. Returns the confirmed messages and, unless all were, why not."""
    for message in pending:
        broker.emit_before("enqueue", message, None)
    # Every body before the first publish (the hooks may change options): nothing goes out if one fails.
    bodies = [message.encode() for message in pending]
    for queue_name in {m.queue_name for m in pending}:
        broker.declare_queue(queue_name, ensure=True)
    nodes = broker.parameters if isinstance(broker.parameters, list) else [broker.parameters]
    for node in nodes:
        publisher = _Publisher(pending, bodies, parameters=node, window=window, timeout=timeout)
        publisher.run()
        if not publisher.unreachable:
            break
        logger.warning(
            "bulk_send_node_unreachable", extra={"node": f"{node.host}:{node.port}", "error": publisher.error}
        )
    confirmed = [
        m
        for i, m in enumerate(pending)
        if i in publisher.confirmed and m.message_id not in publisher.returned_ids
    ]
    if len(confirmed) == len(pending):
        return confirmed, None
    return confirmed, publisher.error or ("unroutable" if publisher.returned_ids else "nacked by RabbitMQ")


def _other_than(messages: list[Message[Any]], confirmed: list[Message[Any]]) -> list[Message[Any]]:
    confirmed_ids = {m.message_id for m in confirmed}
    return [m for m in messages if m.message_id not in confirmed_ids]


def _unsent(broker: RabbitmqBroker, messages: list[Message[Any]]) -> None:
    """Hand the messages not published to the middleware's ``on_unsent_batch`` hooks; one that
    raises is logged, and the send's own error is raised."""
    for middleware in broker.middleware:
        hook = getattr(middleware, "on_unsent_batch", None)
        if hook is not None:
            try:
                hook(broker, messages)
            except Exception:
                logger.exception(
                    "bulk_send_unsent_hook_failed", extra={"middleware": type(middleware).__name__}
                )
