"""One bulk send's publisher on one RabbitMQ node: pika's asynchronous connection, driven by its
callbacks, keeping up to ``window`` publishes in flight and counting the confirms (see
:mod:`jobsystem.rabbitmq.bulk`, which runs one per node until one opens).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import pika
import pika.channel
import pika.exceptions
import pika.frame
import pika.spec
from dramatiq import Message

__all__ = ["CLOSE_TIMEOUT", "Publisher"]

logger = logging.getLogger(__name__)

#: The longest wait (at most the send's ``timeout``) for RabbitMQ to answer the close of the
#: connection, after which its socket is dropped: a broker, or a network path, gone silent would
#: otherwise hold the send forever, pika's close having no timeout.
CLOSE_TIMEOUT = 5.0


@dataclass(repr=False)  # pika logs a failed callback with its object: not every message's arguments
class Publisher:
    """One bulk send's state on one node, driven by pika's asynchronous connection callbacks."""

    messages: list[Message[Any]]
    #: The messages' bodies, encoded before connecting.
    bodies: list[bytes]
    parameters: pika.connection.Parameters
    window: int
    #: The longest wait for a confirm (reset by each one), not a deadline for the whole batch.
    timeout: float
    #: The longest wait for RabbitMQ's answer to the close, then the socket is dropped.
    close_timeout: float
    next_index: int = 0
    published: int = 0
    # delivery tag (1-based publish order on the channel) -> index into messages
    in_flight: dict[int, int] = field(default_factory=dict)
    confirmed: set[int] = field(default_factory=set)
    rejected: set[int] = field(default_factory=set)
    returned_ids: set[str] = field(default_factory=set)
    error: str | None = None
    #: The class of what ``error`` says (pika's error, ``TimeoutError`` for the send's own): a
    #: WARNING names it, ``error`` (pika's text names the node's address) goes at DEBUG only.
    error_class: str | None = None
    #: The connection opened. One that never did published nothing, whatever closed it (pika's
    #: timeouts, a refusal, or ``timeout`` and the close it calls): another node may be tried.
    opened: bool = False
    progress_at: float = 0.0
    #: The connection is being closed (or dropped): no more timeouts, no second close.
    closing: bool = False
    #: The socket is being dropped (see :meth:`_drop_stream`).
    dropped: bool = False
    channel: pika.channel.Channel | None = None
    connection: pika.SelectConnection | None = None

    def run(self) -> None:
        """Connect, publish and count the confirms until every message is answered or the send
        fails (``error``). A callback that raises fails the send, its error named in ``error``,
        instead of escaping. An interrupt (KeyboardInterrupt, or Dramatiq's TimeLimitExceeded or
        Shutdown raised in this thread) escapes as it is, once the socket is dropped: the caller
        counts the confirms from this object. Either way the connection is closed on return."""
        self.connection = pika.SelectConnection(
            parameters=self.parameters,
            on_open_callback=self._on_connection_open,
            on_open_error_callback=self._on_open_error,
            on_close_callback=self._on_connection_closed,
        )
        try:
            self.progress_at = time.monotonic()
            self.connection.ioloop.call_later(self.timeout, self._on_timeout)
            self._serve()
        except BaseException:
            self._drop()
            raise
        finally:
            self.connection.ioloop.close()  # its wake-up socket pair and poller

    def _serve(self) -> None:
        assert self.connection is not None
        while True:
            try:
                self.connection.ioloop.start()  # until a close (or open error) callback stops it
                return
            except Exception as exc:  # from a callback pika does not guard (a timer's): close, go on
                logger.error("bulk_send_callback_failed", exc_info=True)
                self._fail(f"{type(exc).__name__} while publishing: {exc}", type(exc).__name__)

    def _fail(self, reason: str, error_class: str) -> None:
        self._note(reason, error_class)
        self._close()

    def _note(self, reason: str, error_class: str) -> None:
        if self.error is None:  # the first failure is the send's, not what the close it causes says
            self.error, self.error_class = reason, error_class

    def _close(self) -> None:
        """Close the connection, its channel first; RabbitMQ's answer is awaited ``close_timeout``
        at most, then the socket is dropped. One still opening has no close to answer: its socket
        is dropped at once. pika calls a close (or open error) callback either way."""
        assert self.connection is not None
        if self.connection.is_closed:
            self.connection.ioloop.stop()
            return
        if self.closing:
            return
        self.closing = True
        if self.connection.is_open:
            self.connection.close()
        elif not self.connection.is_closing:  # still opening
            self._drop_stream(self.error or "given up while opening")
        self.connection.ioloop.call_later(self.close_timeout, self._on_close_timeout)

    def _on_close_timeout(self) -> None:
        assert self.connection is not None
        if not self.connection.is_closed:
            logger.warning("bulk_send_close_unanswered", extra={"waited_s": self.close_timeout})
            self._drop_stream("close not answered")

    def _drop(self) -> None:
        """After an interrupt (or an error out of the loop): drop the socket now, without waiting
        for RabbitMQ. pika completes it in one turn of its loop (bounded all the same); an error in
        doing so is logged, for the interrupt is what the caller must see."""
        assert self.connection is not None
        self.closing = True
        try:
            if not self.connection.is_closed:
                self._drop_stream("interrupted")
                self.connection.ioloop.call_later(self.close_timeout, self.connection.ioloop.stop)
                self.connection.ioloop.start()  # until the close callback stops it
        except Exception:
            logger.error("bulk_send_drop_failed", exc_info=True)

    def _on_timeout(self) -> None:
        assert self.connection is not None
        if self.closing:  # answered or failed: the close has its own timeout
            return
        idle = time.monotonic() - self.progress_at
        if idle < self.timeout:  # confirms came meanwhile: wait from the last one
            self.connection.ioloop.call_later(self.timeout - idle, self._on_timeout)
        elif not self.opened:
            self._fail(f"not connected within {self.timeout:g} s", "TimeoutError")
        else:
            self._fail(f"no confirm within {self.timeout:g} s", "TimeoutError")

    def _on_open_error(self, connection: pika.SelectConnection, error: BaseException | str) -> None:
        # The reason _fail gave, if it closed the connection; its str() is often empty.
        self._note(f"connection failed: {error!r}", type(error).__name__)
        connection.ioloop.stop()

    def _on_connection_closed(self, connection: pika.SelectConnection, reason: BaseException) -> None:
        if not self._done():
            self._note(f"connection closed: {reason}", type(reason).__name__)
        connection.ioloop.stop()

    def _on_connection_open(self, connection: pika.SelectConnection) -> None:
        self.opened = True
        connection.channel(on_open_callback=self._on_channel_open)

    def _on_channel_open(self, channel: pika.channel.Channel) -> None:
        self.channel = channel
        channel.add_on_close_callback(self._on_channel_closed)
        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(ack_nack_callback=self._on_confirm, callback=lambda _frame: self._publish())

    def _on_channel_closed(self, channel: pika.channel.Channel, reason: BaseException) -> None:
        if not self._done():
            self._fail(f"channel closed: {reason}", type(reason).__name__)
        else:
            self._close()

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
        if self._done():
            self._close()

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

    def _drop_stream(self, why: str) -> None:
        """Close the socket without the AMQP close handshake, once; pika then calls the close (or
        open error) callback from the loop. pika has no public call for it: ``_terminate_stream``
        is what its own heartbeat and blocked-connection timeouts use. It is also how a connection
        still opening is given up: there pika 1.4's ``close()`` aborts with ``ConnectionOpenAborted``,
        which its connection workflow, once the AMQP handshake began, passes on as a class instead
        of an instance, and pika logs the AssertionError that follows. A second drop would abort the
        workflow twice (its completion reported twice: a TypeError)."""
        assert self.connection is not None
        if self.dropped or self.connection.is_closed:
            return
        self.dropped = True
        self.connection._terminate_stream(pika.exceptions.ConnectionClosedByClient(200, why))

    def sent(self) -> list[Message[Any]]:
        """The messages RabbitMQ confirmed (acked, not returned as unroutable) so far, in order."""
        confirmed = [m for i, m in enumerate(self.messages) if i in self.confirmed]
        return [m for m in confirmed if m.message_id not in self.returned_ids]
