"""The project's RabbitMQ consumer: every delivery ends acked once what it decided is safe in
RabbitMQ, dead-lettered, or held and requeued later; none can crash a thread or loop hot.

- Each body is checked (``jobsystem.runtime.message_shape``) before anything reads its fields; one that
  is not a well-formed message for this queue is dead-lettered as it is, byte for byte, with
  reason ``malformed`` and headers naming what is wrong, then acked. Non-JSON bodies included.
- A failed message's dead letter is published by the consumer (the final record as headers,
  confirmed) and only then is the original acked.
- A follow-up publish (the retry, the dead letter) that RabbitMQ refuses holds the delivery and
  requeues it after a growing delay, counted, with an alert after a few refusals
  (``jobsystem.runtime.follow_ups``); when the delivery comes back, the consumer publishes the decided
  follow-up itself instead of running the actor again.
- Acks leave in batches (one hand-off to the connection's thread), cumulative where the channel's
  open deliveries allow, waiting a few ms for a delivery running below (:mod:`jobsystem.rabbitmq.acks`).
- A delay-queue message due further ahead than the broker's delay horizon (sent before the delay
  cascade existed, or by plain Dramatiq) is moved into the cascade, confirmed, then acked, rather
  than held unacked past RabbitMQ's ``consumer_timeout``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import pika
import pika.exceptions
import pika.spec
from dramatiq import Message
from dramatiq.broker import MessageProxy
from dramatiq.common import current_millis, q_name
from dramatiq.errors import ConnectionClosed

from jobsystem.dramatiq_internals import (
    ProjectMessage,
    RabbitmqConsumer,
    mark_dead_lettered,
    pending_follow_up,
    project_message,
    request_redelivery,
    stored_exception,
    wants_redelivery,
)
from jobsystem.rabbitmq.acks import AckBatch
from jobsystem.rabbitmq.bursts import buffered_deliveries
from jobsystem.rabbitmq.dead_letter_bodies import dead_letter_body, kept_properties
from jobsystem.runtime.attempts import enqueue_retry
from jobsystem.runtime.closing import close_quietly
from jobsystem.runtime.connecting import connection_closed_on_failure
from jobsystem.runtime.consumer_thread import consumer_publishing
from jobsystem.runtime.follow_ups import DeadLetterFollowUp, FollowUp, RetryFollowUp
from jobsystem.runtime.message_shape import Malformed, decode
from middleware.dead_letters import HEADER_REASON

if TYPE_CHECKING:
    from jobsystem.rabbitmq.broker import ProjectBroker

__all__ = ["DeadLetteringConsumer"]

logger = logging.getLogger(__name__)

_Delivery = tuple[pika.spec.Basic.Deliver, pika.spec.BasicProperties, bytes]

#: How long an ack may wait for an open delivery below it, so that one cumulative ack covers
#: both (:class:`~jobsystem.rabbitmq.acks.AckBatch`): worker threads finish out of order when
#: their jobs wait on the state store (a claim, a token), and one ack frame per job costs
#: RabbitMQ about 30 us of CPU. Acks wait only behind a delivery handed out less than
#: ``ACK_HOLD_BEHIND_S`` ago, never behind a long job or a delayed message.
ACK_HOLD_S = 0.010
ACK_HOLD_BEHIND_S = 0.050

#: The longest a delay queue's consumer waits for a delivery before its thread looks at the
#: messages it holds: Dramatiq releases a due one only then (every ``dramatiq_worker_timeout``,
#: 1 s by default), so delays, retries and rate-limit slots could run up to a second late.
DELAY_TICK_MS = 100


class DeadLetteringConsumer(RabbitmqConsumer):
    """Dramatiq's consumer, checking every body and never losing or spinning on a follow-up.

    - ``__next__``: check the body's shape (malformed: dead-lettered here); a redelivery whose
      follow-up was decided and refused before: publish that follow-up, do not run it again.
    - ``nack``: publish the record to the dead-letter exchange, wait for the confirm, then ack.
    - ``ack`` of a message whose follow-up publish failed (``request_redelivery``), or a dead
      letter that cannot be published: hold it, requeue it after a growing delay.
    """

    broker: ProjectBroker

    def __init__(self, broker: ProjectBroker, queue_name: str, prefetch: int, timeout: int) -> None:
        if queue_name.endswith(".DQ"):
            timeout = min(timeout, DELAY_TICK_MS)
        with connection_closed_on_failure():  # a RabbitMQ that never answers the handshake too
            super().__init__(broker, queue_name, prefetch, timeout)  # type: ignore[no-untyped-call]
        # The middleware that want each burst of deliveries as it arrives (claims made ahead),
        # looked up once per consumer rather than on every message.
        self.receive_hooks = [m.on_receive for m in broker.middleware if hasattr(m, "on_receive")]
        # ... and those that undo what they started for a delivery dropped before it was handed out.
        self.drop_hooks = [m.on_dropped for m in broker.middleware if hasattr(m, "on_dropped")]
        self.acks = AckBatch(self.connection, self.channel, hold_s=ACK_HOLD_S, young_s=ACK_HOLD_BEHIND_S)
        #: The rest of the last burst, handed out one by one before the next delivery is read.
        self.ready: deque[ProjectMessage] = deque()

    def close(self) -> None:
        """Queue the acks held back for a cumulative ack before Dramatiq closes the channel (it
        runs the connection's pending callbacks first, in order), so a stop redelivers none. The
        rest of a burst not handed out is dropped (RabbitMQ redelivers it, as every unacked
        delivery), through the drop hooks: the claims made for it are given back. RabbitMQ's
        answers to the closes are waited for a bounded time (``jobsystem.runtime.closing``)."""
        while self.ready:
            self._dropped(self.ready.popleft())
        with contextlib.suppress(pika.exceptions.AMQPError):
            self.connection.add_callback_threadsafe(self.acks.release_held)
        self.broker.closes.run([(self, self._close_both)])

    def _close_both(self) -> None:
        """Dramatiq's close, then the connection's whatever it raised: once RabbitMQ closed the
        channel (a queue deleted, ``consumer_timeout``), Dramatiq's raised on it and left the
        connection open, one more with each restart of the consumer."""
        try:
            RabbitmqConsumer.close(self)  # type: ignore[no-untyped-call]
        finally:
            close_quietly(self.connection)

    # -- receiving -------------------------------------------------------------------------------

    def __next__(self) -> ProjectMessage | None:
        if self.ready:
            return self.ready.popleft()
        delivery = self._next_delivery()
        if delivery is None:
            return None
        if not self.receive_hooks:
            return self._checked(delivery)
        # The deliveries pika has read along with this one join it: one burst for the hooks.
        deliveries = [delivery]
        for _ in range(buffered_deliveries(self.channel)):
            more = self._next_delivery()
            if more is None:
                break
            deliveries.append(more)
        burst = [message for message in map(self._checked, deliveries) if message is not None]
        if burst:
            self._received(burst)
            self.ready.extend(burst)
        return self.ready.popleft() if self.ready else None

    def _checked(self, delivery: _Delivery) -> ProjectMessage | None:
        """The delivery as a message to run, or None when the consumer settled it itself: a
        malformed body (dead-lettered), a redelivery whose follow-up was decided, a delayed
        message due beyond the horizon (moved into the cascade)."""
        method, properties, body = delivery
        decoded = decode(body, self.queue_name)
        if isinstance(decoded, Malformed):
            self._dead_letter_malformed(method.delivery_tag, properties, body, decoded)
            return None
        if method.redelivered:
            follow_up = self.broker.refused_follow_ups.decided(decoded.message_id)
            if follow_up is not None:
                self._publish_decided(method.delivery_tag, decoded.message_id, follow_up)
                return None
        if self._due_beyond_horizon(decoded):
            self._reschedule(method.delivery_tag, decoded)
            return None
        message = ProjectMessage(method.redelivered, method.delivery_tag, decoded)
        message.delivered_on = self
        self.known_tags.add(method.delivery_tag)
        return message

    def _received(self, burst: list[ProjectMessage]) -> None:
        """Run the receive hooks (claims made ahead) on a burst, before any of it is handed out."""
        # An optimisation only: the hook's before_process_message decides.
        self._call_each(self.receive_hooks, burst, failed="receive_hook_failed", messages=len(burst))

    def _dropped(self, message: ProjectMessage) -> None:
        self._call_each(self.drop_hooks, message, failed="drop_hook_failed", message_id=message.message_id)

    def _call_each(self, hooks: list[Callable[..., None]], *args: Any, failed: str, **fields: Any) -> None:
        """Call each hook with the broker and ``args``; one that raises is logged as ``failed``."""
        for hook in hooks:
            try:
                hook(self.broker, *args)
            except Exception:
                logger.exception(failed, extra=fields)

    def _due_beyond_horizon(self, message: Message[Any]) -> bool:
        eta = message.options.get("eta")
        if not isinstance(eta, int | float) or not self.queue_name.endswith(".DQ"):
            return False
        return bool(eta - current_millis() > self.broker.delay_horizon_ms)

    def _reschedule(self, tag: int, message: Message[Any]) -> None:
        """Move a delayed message due beyond the horizon into the delay cascade, then ack it."""
        eta = int(message.options["eta"])
        options = {k: v for k, v in message.options.items() if k != "eta"}
        waiting = dataclasses.replace(message, queue_name=q_name(message.queue_name), options=options)
        logger.info("delay_moved_to_cascade", extra={"message_id": message.message_id, "eta": eta})
        publish = partial(self.broker.schedule_at, waiting, eta)
        self._publish_then_ack(tag, message.message_id, "schedule", publish, None)

    def _next_delivery(self) -> _Delivery | None:
        """The next delivery, or None when the queue stayed idle for the consumer's timeout."""
        try:
            method, properties, body = next(self.iterator)
        except (
            AssertionError,
            pika.exceptions.AMQPConnectionError,
            pika.exceptions.AMQPChannelError,
        ) as exc:
            # A queue that disappeared is declared again when the consumer restarts.
            if getattr(exc, "reply_code", None) == 404:
                self.broker.queues_pending.add(q_name(self.queue_name))
            raise ConnectionClosed(exc) from None  # type: ignore[no-untyped-call]
        if method is None:
            return None
        self.acks.delivered(method.delivery_tag)  # open until its settlement frame is queued
        return method, properties, body

    def _dead_letter_malformed(
        self, tag: int, properties: pika.spec.BasicProperties, body: bytes, malformed: Malformed
    ) -> None:
        """Publish a malformed body to the dead letters as it is, confirmed, then ack it. Its id:
        the delivery's ``message_id`` property, else the body's if well formed, else a hash."""
        key = (
            properties.message_id
            or malformed.message_id
            or f"malformed-{hashlib.sha256(body).hexdigest()[:16]}"
        )
        if not self.broker.refused_follow_ups.refusals(key):  # logged once, not per redelivery
            logger.error(
                "message_malformed",
                extra={
                    "message_id": key,
                    "queue": q_name(self.queue_name),
                    "field": malformed.field,
                    "problem": malformed.problem,
                    "size": len(body),
                },
            )
        kept, original_headers = kept_properties(properties)
        record = self.broker.dead_letters.malformed_record(self.broker, self.queue_name, malformed)
        publish = partial(
            self.broker.publish_dead_letter,
            body,
            {**original_headers, **record},
            key,
            self.queue_name,
            properties=kept,
        )
        self._publish_then_ack(tag, key, "dead_letter", publish, None)

    def _publish_decided(self, tag: int, message_id: str, follow_up: FollowUp) -> None:
        """Publish the follow-up a refused delivery had decided, then ack it (or hold it again)."""
        publish: Callable[[], Any]
        if isinstance(follow_up, RetryFollowUp):
            publish = partial(enqueue_retry, self.broker, follow_up.message, follow_up.delay_ms)
        else:
            publish = partial(
                self.broker.publish_dead_letter,
                follow_up.body,
                follow_up.headers,
                message_id,
                self.queue_name,
            )
        published = self._publish_then_ack(tag, message_id, follow_up.kind, publish, follow_up)
        if published and isinstance(follow_up, DeadLetterFollowUp):
            # Now it is dead-lettered: the nack hooks that skipped the refused one (lifecycle's
            # job_dead_lettered, the dead status, the reject count) see it, then its hook is told.
            message = ProjectMessage(True, tag, follow_up.message)
            mark_dead_lettered(message, follow_up.headers.get(HEADER_REASON))
            self.broker.emit_after("nack", message)
            self._notify(follow_up.message, follow_up.headers)

    def _publish_then_ack(
        self, tag: int, key: str, kind: str, publish: Callable[[], Any], follow_up: FollowUp | None
    ) -> bool:
        """``publish()`` then ack delivery ``tag``; if RabbitMQ refuses, count it and requeue the
        delivery later instead. Returns whether it was published."""
        refused = self.broker.refused_follow_ups
        queue = q_name(self.queue_name)
        try:
            with consumer_publishing():  # no hook waits on the store on this thread
                publish()
        except Exception as exc:
            delay = refused.refused(key, kind=kind, queue=queue, follow_up=follow_up, error=exc)
            self._requeue_later(tag, delay)
            return False
        refused.published(key, kind=kind, queue=queue)
        self._settle(partial(self._ack_now, tag))
        return True

    # -- settling --------------------------------------------------------------------------------

    def ack(self, message: MessageProxy) -> None:
        if isinstance(message, ProjectMessage) and wants_redelivery(message):
            self._hold(message, pending_follow_up(message), "retry", None)
        else:
            self._ack(message)

    def _ack(self, message: MessageProxy) -> None:
        """Ack a delivery with the others finished meanwhile (:mod:`jobsystem.rabbitmq.acks`)."""
        if not self._forget(message):  # the consumer reconnected since: RabbitMQ redelivers it anyway
            logger.warning("ack_unknown_delivery", extra={"message_id": message.message_id})
            return
        self.acks.add(message._tag)

    def _forget(self, message: MessageProxy) -> bool:
        """Whether ``message`` is one of this channel's open deliveries, no longer counted open.

        Its tag alone does not tell: Dramatiq settles through its consumer thread's current
        consumer, and one restarted after a lost connection numbers its deliveries from 1 again,
        so the tag of a job that ran across the restart may name another delivery, still running
        or queued, which an ack would lose."""
        if getattr(message, "delivered_on", None) is not self:
            return False
        try:
            self.known_tags.remove(message._tag)
        except KeyError:
            return False
        return True

    def nack(self, proxy: MessageProxy) -> None:
        broker, message = self.broker, project_message(proxy)
        if message.delivered_on is not self or message.tag not in self.known_tags:  # not open here
            self._unknown_nack(message)
            return
        headers = broker.dead_letters.record(broker, message, stored_exception(message))
        body: bytes | None = None
        try:
            body = dead_letter_body(message)
            broker.publish_dead_letter(body, headers, message.message_id, message.queue_name)
        except Exception as exc:
            logger.exception("dead_letter_publish_failed", extra={"message_id": message.message_id})
            follow_up = DeadLetterFollowUp(body, headers, message.message) if body is not None else None
            request_redelivery(message, follow_up)  # the lifecycle log then says "requeued"
            self._hold(message, follow_up, "dead_letter", exc)
            return
        mark_dead_lettered(message, headers[HEADER_REASON])
        self._ack(message)
        self._notify(message, headers)

    def _unknown_nack(self, message: ProjectMessage) -> None:
        """Publish nothing: Dramatiq retries a whole nack whose ack found the connection lost, and
        its dead letter is out already. One of an earlier channel (the consumer reconnected) is
        redelivered and decided again: the hooks are told it is requeued, not dead."""
        logger.warning("nack_unknown_delivery", extra={"message_id": message.message_id})
        if message.delivered_on is not self:
            request_redelivery(message)

    def _notify(self, message: Message[Any] | MessageProxy, headers: dict[str, Any]) -> None:
        try:
            self.broker.dead_letters.notify(self.broker, message, headers)  # type: ignore[arg-type]
        except Exception:  # the dead letter is safe; only the application's hook was not told
            logger.exception("dead_letter_hook_failed", extra={"message_id": message.message_id})

    def _hold(
        self, message: ProjectMessage, follow_up: FollowUp | None, kind: str, error: BaseException | None
    ) -> None:
        """Count the refused follow-up of ``message``, remember it, and requeue the delivery later."""
        delay = self.broker.refused_follow_ups.refused(
            message.message_id, kind=kind, queue=q_name(self.queue_name), follow_up=follow_up, error=error
        )
        if not self._forget(message):  # the consumer reconnected since: RabbitMQ redelivers it anyway
            return
        self._requeue_later(message.tag, delay)

    def _requeue_later(self, tag: int, delay: float) -> None:
        """Requeue delivery ``tag`` in ``delay`` seconds, on the connection's own thread (the
        delivery stays unacked, so held by this consumer, until then)."""
        requeue = partial(self._requeue_now, tag)
        try:
            self.connection.add_callback_threadsafe(partial(self.connection.call_later, delay, requeue))
        except pika.exceptions.AMQPError:  # the connection closed: RabbitMQ requeues it anyway
            logger.warning("requeue_failed", extra={"delivery_tag": tag}, exc_info=True)

    def _requeue_now(self, tag: int) -> None:
        """On the connection's thread: requeue delivery ``tag``."""
        try:
            if self.channel.is_open:
                self.acks.settled(tag)
                self.channel.basic_nack(tag, requeue=True)
        except Exception:  # the channel closed meanwhile: RabbitMQ requeued the delivery itself
            logger.warning("requeue_failed", extra={"delivery_tag": tag}, exc_info=True)

    def _ack_now(self, tag: int) -> None:
        """On the connection's thread: ack delivery ``tag`` on its own, at once."""
        self.acks.settled(tag)
        self.channel.basic_ack(tag)

    def _settle(self, callback: Callable[[], Any]) -> None:
        """Run ``callback`` (an ack) on the connection's thread, as Dramatiq's ``ack`` does."""
        try:
            self.connection.add_callback_threadsafe(callback)
        except (pika.exceptions.AMQPConnectionError, pika.exceptions.AMQPChannelError) as exc:
            raise ConnectionClosed(exc) from None  # type: ignore[no-untyped-call]
