"""Build the RabbitMQ broker from settings: confirms on, durable queues, priorities, explicit
timeouts, and dead letters routed through an exchange of the project's."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pika
import pika.exceptions
from dramatiq import Message
from dramatiq.common import current_millis, dq_name, q_name
from dramatiq.errors import ConnectionClosed
from dramatiq.middleware import Middleware

from jobsystem.dramatiq_internals import RabbitmqConsumer, RabbitmqTopology, ThreadConnections
from jobsystem.rabbitmq.consumer import DeadLetteringConsumer
from jobsystem.rabbitmq.dead_letter_indexer import DeadLetterIndexer
from jobsystem.rabbitmq.delays import DelayCascade, cascade_seconds, routing_key
from jobsystem.rabbitmq.dispatch import HookDispatch
from jobsystem.runtime.actor_names import actor_queues
from jobsystem.runtime.follow_ups import RefusedFollowUps
from jobsystem.settings import Settings
from jobsystem.store.base import StateStore
from middleware.dead_letters import HEADER_ENVIRONMENT, DeadLetters
from middleware.idempotency import DuplicateMessage, as_duplicate

__all__ = [
    "DEAD_LETTER_EXCHANGE",
    "DEAD_LETTER_PUBLISH_ATTEMPTS",
    "DEAD_LETTER_SUFFIX",
    "DEFAULT_DELAY_HORIZON_MS",
    "PUBLISH_ATTEMPTS",
    "ProjectBroker",
    "QueueArgumentsMismatch",
    "actor_queues",
    "build_broker",
    "connection_urls",
    "dead_letter_queue",
]

logger = logging.getLogger(__name__)

#: The direct exchange every work queue dead-letters into, routed by canonical queue name (queue
#: names carry QUEUE_PREFIX already, so one exchange serves every environment of a vhost).
DEAD_LETTER_EXCHANGE = "jobs.dead-letters"

#: Publish attempts for a dead letter before the delivery is requeued instead.
DEAD_LETTER_PUBLISH_ATTEMPTS = 3


#: Publish attempts of a message (as Dramatiq's own ``enqueue``).
PUBLISH_ATTEMPTS = 6

#: Delays up to this long wait in the delay queue, held by a worker; longer ones in the cascade.
DEFAULT_DELAY_HORIZON_MS = 30_000

#: Suffix of a dead-letter queue's name (in place of Dramatiq's ``.XQ``, which has a 7-day TTL).
DEAD_LETTER_SUFFIX = ".DLQ"


def dead_letter_queue(queue_name: str) -> str:
    """The durable queue holding ``queue_name``'s dead letters."""
    return q_name(queue_name) + DEAD_LETTER_SUFFIX


class QueueArgumentsMismatch(RuntimeError):
    """A queue exists with other arguments than this project declares (RabbitMQ answers 406)."""


class ProjectBroker(HookDispatch, ThreadConnections, RabbitmqTopology):
    """Dramatiq's RabbitMQ broker with the project's dead-letter topology and duplicate answers.

    - Work and delay queues dead-letter into the direct exchange ``dead_letter_exchange``, routed
      by the canonical queue name into ``<queue>.DLQ``: durable, kept until replayed or purged
      (optionally capped by ``dead_letter_ttl_ms`` / ``dead_letter_max_length``).
    - Failed messages are not left to RabbitMQ's own dead-lettering (which keeps the body as last
      delivered): the consumer publishes the final record (see ``middleware.dead_letters``),
      confirmed, then acks; so it does with bodies that are not well-formed messages
      (``jobsystem.rabbitmq.consumer``). Follow-ups RabbitMQ refuses are counted in ``refused_follow_ups``.
    - Every dead letter carries ``environment`` (its ``QUEUE_PREFIX``) in ``x-dl-environment``:
      environments share the exchange and the record's format, and a queue name cannot tell
      ``jobs`` + ``2emails`` from ``jobs2`` + ``emails``; the operator tools change only the
      letters of their own environment (:func:`jobsystem.ops.scope.changeable`).
    - A send dropped as a duplicate by the idempotency middleware returns the message carrying the
      first message's id and ``duplicate=True``, as BullMQ answers a known ``jobId``.
    - Each dead letter RabbitMQ confirmed is indexed in the state store (``dead_letter_index``,
      :mod:`jobsystem.rabbitmq.dead_letter_indexer`, written in the background), so the dashboard
      pages through dead letters without reading the queues.
    - Hooks are called only on the middleware that define them (:mod:`jobsystem.rabbitmq.dispatch`),
      and the consumer sends acks in batches (:mod:`jobsystem.rabbitmq.acks`).
    - A delay longer than ``delay_horizon_ms`` waits in RabbitMQ's delay cascade
      (:mod:`jobsystem.rabbitmq.delays`), not in a worker: the message, carrying its ``eta``,
      reaches ``<queue>.DQ`` about a second before it is due and the worker releases it then.
    - Every publish carries its time as the AMQP ``timestamp`` property (seconds): for a message
      in a work queue, when it became ready there (a delayed message and a retry are published
      again when due), which the health check reads as the waiting message's age.
    - Each thread's connection is noted with its thread, under a lock ``close()`` holds
      (:class:`~jobsystem.dramatiq_internals.ThreadConnections`): closing is safe while threads
      open or close theirs, and the watchdog closes those of the threads it replaces.
    """

    def __init__(
        self,
        *,
        environment: str,
        dead_letter_exchange: str = DEAD_LETTER_EXCHANGE,
        dead_letter_ttl_ms: int | None = None,
        dead_letter_max_length: int | None = None,
        state: StateStore | None = None,
        delay_prefix: str = "",
        delay_horizon_ms: int = DEFAULT_DELAY_HORIZON_MS,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        #: The environment (``QUEUE_PREFIX``) stamped on every dead letter published here.
        self.environment = environment
        self.delays = DelayCascade(delay_prefix)
        self.delay_horizon_ms = delay_horizon_ms
        self._cascade_declared = False
        self.dead_letter_exchange = dead_letter_exchange
        self.dead_letter_ttl_ms = dead_letter_ttl_ms
        self.dead_letter_max_length = dead_letter_max_length
        found = [m for m in self.middleware if isinstance(m, DeadLetters)]
        self.dead_letters = found[0] if found else DeadLetters()
        self.refused_follow_ups = RefusedFollowUps(store=state)
        self.dead_letter_index = (
            DeadLetterIndexer(state, ttl_ms=dead_letter_ttl_ms, max_length=dead_letter_max_length)
            if state is not None
            else None
        )

    @property
    def consumer_class(self) -> type[RabbitmqConsumer]:
        return DeadLetteringConsumer

    def enqueue(self, message: Message[Any], *, delay: int | None = None) -> Message[Any]:
        if delay is not None and delay > self.delay_horizon_ms:
            return self._sent(message, partial(self._schedule, message, delay))
        return self._sent(message, partial(self._enqueue, message, delay))

    def schedule_at(self, message: Message[Any], eta: int) -> Message[Any]:
        """Enqueue ``message`` due at ``eta`` (ms since 1970) exactly: a delay moved out of a delay
        queue keeps its due time (``enqueue`` takes a delay, and would read the clock again)."""
        delay = max(0, eta - current_millis())
        if delay <= self.delay_horizon_ms:
            return self.enqueue(message, delay=delay)
        return self._sent(message, partial(self._schedule, message, delay, eta=eta))

    def _sent(self, message: Message[Any], publish: Callable[[], Message[Any]]) -> Message[Any]:
        """``publish()``'s message; for a duplicate, a copy carrying the original id. A publish
        that raises is raised after the middleware's ``on_unsent`` hooks (a key registered for
        ``message`` is forgotten, so the sender's next send of it is not dropped as a duplicate)."""
        try:
            return publish()
        except DuplicateMessage as duplicate:
            return as_duplicate(message, duplicate.original_message_id)
        except Exception:
            for middleware in self.middleware:
                if hasattr(middleware, "on_unsent"):
                    middleware.on_unsent(self, message)
            raise

    def _enqueue(self, message: Message[Any], delay: int | None) -> Message[Any]:
        """Dramatiq's ``enqueue``: into the work queue, or with ``delay`` into its delay queue."""
        canonical = q_name(message.queue_name)
        if delay is not None:
            options = {"eta": current_millis() + delay}
            message = message.copy(queue_name=dq_name(canonical), options=options)
        return self._publish(message, delay, "", message.queue_name, cascade=False)

    def _schedule(self, message: Message[Any], delay: int, *, eta: int | None = None) -> Message[Any]:
        """Publish ``message`` into the delay cascade, bound for its delay queue at ``eta`` (default:
        now + ``delay``)."""
        canonical = q_name(message.queue_name)
        seconds = cascade_seconds(delay)
        due = current_millis() + delay if eta is None else eta
        message = message.copy(queue_name=dq_name(canonical), options={"eta": due})
        key = routing_key(seconds, dq_name(canonical))
        return self._publish(message, delay, self.delays.exchange_for(seconds), key, cascade=True)

    def _publish(
        self, message: Message[Any], delay: int | None, exchange: str, key: str, *, cascade: bool
    ) -> Message[Any]:
        """The steps of Dramatiq's ``enqueue`` (the hooks see ``message`` and ``delay``; a lost
        connection or channel is tried again): a persistent publish, mandatory and confirmed with
        publisher confirms, stamped with its time, into ``exchange`` with routing key ``key``."""
        canonical = q_name(message.queue_name)
        for attempt in range(1, PUBLISH_ATTEMPTS + 1):
            try:
                self.declare_queue(canonical, ensure=True)
                if cascade:
                    self.ensure_delays()
                self.emit_before("enqueue", message, delay)
                priority = message.options.get("broker_priority")
                properties = pika.BasicProperties(
                    delivery_mode=2, priority=priority, timestamp=int(time.time())
                )
                self.publish_confirmed(
                    exchange=exchange,
                    routing_key=key,
                    body=message.encode(),
                    properties=properties,
                    mandatory=self.confirm_delivery,
                )
                self.emit_after("enqueue", message, delay)
                return message
            except (pika.exceptions.AMQPConnectionError, pika.exceptions.AMQPChannelError) as exc:
                del self.connection
                # A queue or exchange deleted under us (404, unroutable): declare them all again.
                self.queues_pending.add(canonical)
                if cascade:
                    self._cascade_declared = False
                if attempt == PUBLISH_ATTEMPTS:
                    raise ConnectionClosed(exc) from None  # type: ignore[no-untyped-call]
        raise AssertionError("unreachable")  # pragma: no cover

    def publish_confirmed(self, **publish: Any) -> None:
        """Publish on this thread's channel and wait for RabbitMQ's confirm; anything raised (an
        interrupt too: a time limit, a cancellation, a shutdown) drops the thread's connection
        first, then is raised. pika's channel matches confirms to publishes by arrival: a publish
        left waiting would have its confirm answer the thread's next publish (a retry reported
        confirmed before RabbitMQ said anything of it), so that channel is never used again."""
        try:
            self.channel.basic_publish(**publish)
        except BaseException:
            del self.connection
            raise

    def ensure_delays(self) -> None:
        """Declare the delay cascade once per broker (its declarations are idempotent)."""
        if not self._cascade_declared:
            self.delays.declare(self.channel)
            self._cascade_declared = True

    # -- topology --------------------------------------------------------------------------------

    def queue_arguments(self, queue_name: str) -> dict[str, Any]:
        arguments: dict[str, Any] = {
            "x-dead-letter-exchange": self.dead_letter_exchange,
            "x-dead-letter-routing-key": q_name(queue_name),
        }
        if self.max_priority:
            arguments["x-max-priority"] = self.max_priority
        return arguments

    def dead_letter_arguments(self) -> dict[str, Any]:
        """Arguments of the dead-letter queues: none (kept forever) unless a TTL or cap is set."""
        arguments: dict[str, Any] = {}
        if self.dead_letter_ttl_ms:
            arguments["x-message-ttl"] = self.dead_letter_ttl_ms
        if self.dead_letter_max_length:
            arguments["x-max-length"] = self.dead_letter_max_length
        return arguments

    def _declare_checked(self, queue_name: str, arguments: dict[str, Any]) -> Any:
        try:
            return self.channel.queue_declare(queue=queue_name, durable=True, arguments=arguments)
        except pika.exceptions.ChannelClosedByBroker as exc:
            del self.channel
            if exc.reply_code != 406:
                raise
            raise QueueArgumentsMismatch(
                f"queue {queue_name!r} exists with other arguments than this project declares "
                "(created by plain Dramatiq or an older configuration). Stop the workers and run "
                "`jobctl migrate-queues` to recreate it without losing its messages."
            ) from None

    def declare_work_queue(self, queue_name: str) -> Any:
        return self._declare_checked(queue_name, self.queue_arguments(queue_name))

    def declare_delay_queue(self, queue_name: str) -> Any:
        """Declare ``<queue>.DQ`` and route the delay cascade's exits for it into it."""
        result = self._declare_checked(dq_name(queue_name), self.queue_arguments(queue_name))
        self.bind_delays(queue_name)
        return result

    def bind_delays(self, queue_name: str) -> None:
        """Declare the delay cascade if need be and route its exits for ``queue_name`` into
        ``<queue>.DQ`` (a binding goes with its queue: again after the queue is recreated)."""
        self.ensure_delays()
        self.delays.bind(self.channel, dq_name(queue_name))

    def declare_dead_letter_queue(self, queue_name: str) -> Any:
        """Declare the dead-letter exchange and ``<queue>.DLQ`` bound to it (in place of ``.XQ``)."""
        self.channel.exchange_declare(self.dead_letter_exchange, exchange_type="direct", durable=True)
        result = self._declare_checked(dead_letter_queue(queue_name), self.dead_letter_arguments())
        self.channel.queue_bind(
            dead_letter_queue(queue_name), self.dead_letter_exchange, routing_key=queue_name
        )
        return result

    # -- dead letters ----------------------------------------------------------------------------

    def publish_dead_letter(
        self,
        body: bytes,
        headers: dict[str, Any],
        message_id: str,
        queue_name: str,
        *,
        properties: Mapping[str, Any] | None = None,
    ) -> None:
        """Publish one dead letter, stamped with this broker's environment, and wait for RabbitMQ's
        confirm; raise if it cannot be had. ``properties``: more AMQP properties (a malformed
        delivery's content type...)."""
        headers = {**headers, HEADER_ENVIRONMENT: self.environment}
        amqp = pika.BasicProperties(
            **{**(properties or {}), "delivery_mode": 2, "message_id": message_id, "headers": headers}
        )
        for attempt in range(1, DEAD_LETTER_PUBLISH_ATTEMPTS + 1):
            try:
                self.declare_queue(q_name(queue_name), ensure=True)
                self.publish_confirmed(
                    exchange=self.dead_letter_exchange,
                    routing_key=q_name(queue_name),
                    body=body,
                    properties=amqp,
                    mandatory=True,
                )
                if self.dead_letter_index is not None:  # confirmed: filed for the dashboard
                    self.dead_letter_index.record(q_name(queue_name), message_id, headers, body)
                return
            except (pika.exceptions.AMQPConnectionError, pika.exceptions.AMQPChannelError) as exc:
                del self.connection
                # The .DLQ or the exchange deleted under us (unroutable): declare them again.
                self.queues_pending.add(q_name(queue_name))
                if attempt == DEAD_LETTER_PUBLISH_ATTEMPTS:
                    raise ConnectionClosed(exc) from None  # type: ignore[no-untyped-call]

    def close(self) -> None:
        if self.dead_letter_index is not None:
            self.dead_letter_index.flush(5.0)  # what the worker indexed last, before it exits
        super().close()


def connection_urls(settings: Settings) -> list[str]:
    """Each node of ``RABBITMQ_URL`` with an explicit heartbeat and ``blocked_connection_timeout``.

    Without a blocked-connection timeout a publish blocks forever while RabbitMQ has a memory or
    disk alarm; values already in a URL's query string win.
    """
    urls = []
    for node in settings.rabbitmq_url.split(";"):
        parts = urlsplit(node)
        query = dict(parse_qsl(parts.query))
        query.setdefault("heartbeat", str(settings.rabbitmq_heartbeat))
        query.setdefault("blocked_connection_timeout", str(settings.rabbitmq_blocked_connection_timeout))
        query.setdefault("connection_attempts", "3")
        query.setdefault("retry_delay", "1")
        urls.append(urlunsplit(parts._replace(query=urlencode(query))))
    return urls


def build_broker(
    settings: Settings, middleware: list[Middleware], state: StateStore | None = None
) -> ProjectBroker:
    """A broker whose every publish waits for RabbitMQ's confirm and whose queues take priorities
    (unless ``RABBITMQ_MAX_PRIORITY`` is 0).

    Dramatiq declares its queues durable and publishes persistent messages (delivery mode 2);
    ``confirm_delivery`` makes a publish to a missing queue or during a broker failure an error
    instead of a silent loss.
    """
    return ProjectBroker(
        environment=settings.queue_prefix,
        dead_letter_ttl_ms=settings.dead_letter_ttl_ms,
        dead_letter_max_length=settings.dead_letter_max_length,
        url=connection_urls(settings),
        confirm_delivery=True,
        max_priority=settings.rabbitmq_max_priority or None,  # 0: plain queues (Dramatiq's None)
        middleware=middleware,
        state=state,
        delay_prefix=settings.queue_prefix,
        delay_horizon_ms=settings.delay_horizon_ms,
    )
