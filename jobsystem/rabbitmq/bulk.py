"""Bulk send: publish many messages with pipelined publisher confirms.

``actor.send()`` with confirms waits for each message's own confirm (~1.4k messages/s here).
:func:`send_bulk` keeps up to ``window`` publishes in flight on one dedicated connection and counts
RabbitMQ's (possibly ``multiple``) acks, so a campaign fan-out of thousands of messages costs one
round trip per window instead of one per message. It returns only when every message is confirmed,
and raises :class:`BulkSendError` naming the messages that were not; the idempotency keys of the
messages not confirmed are given back whatever the failure, an interrupt included. Its connection
is closed on every way out, without waiting for an answer RabbitMQ may never give (pika's close has
no timeout of its own).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import dramatiq
from dramatiq import Message
from dramatiq.brokers.rabbitmq import RabbitmqBroker

from jobsystem.privacy.outage_lines import log_failure
from jobsystem.rabbitmq.bulk_publisher import CLOSE_TIMEOUT, Publisher
from middleware.idempotency import as_duplicate

__all__ = ["BulkSendError", "send_bulk"]

logger = logging.getLogger(__name__)


class BulkSendError(RuntimeError):
    """Some messages of a bulk send were not confirmed by RabbitMQ.

    ``failed`` holds them (nacked, returned as unroutable, or unconfirmed when the connection
    dropped or went silent); ``confirmed`` holds the others. The idempotency keys of ``failed``
    were given back: sending them again (or new messages with their keys) publishes them, and one
    RabbitMQ had after all still runs once (the claim at run).

    ``reason`` (and so the error's text) may quote pika's error, which names RabbitMQ's host and
    port: what a user or Sentry sees names the failure by ``error_class`` (pika's error class,
    ``TimeoutError``, or ``nacked``/``unroutable``), never by the text.
    """

    def __init__(
        self,
        reason: str,
        failed: list[Message[Any]],
        confirmed: list[Message[Any]],
        error_class: str = "unknown",
    ) -> None:
        ids = ", ".join(m.message_id for m in failed[:5]) + (" ..." if len(failed) > 5 else "")
        super().__init__(
            f"{len(failed)} of {len(failed) + len(confirmed)} messages not confirmed ({reason}): {ids}"
        )
        self.reason = reason
        self.error_class = error_class
        self.failed = failed
        self.confirmed = confirmed


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
    is tried in turn until one accepts the connection (pika's ``socket_timeout``,
    ``stack_timeout`` and ``connection_attempts`` from the URL bound the wait, and ``timeout``
    bounds each node's); a node whose connection never opened, whatever closed it, published
    nothing, and the next one is tried.

    An interrupt in the sending thread (KeyboardInterrupt; Dramatiq's TimeLimitExceeded or Shutdown
    when an actor sends) drops the connection at once and is raised unchanged, after the confirmed
    messages' ``after_enqueue`` hooks (in-process bookkeeping: status, logs, held keys) and the
    ``on_unsent_batch`` hooks for the others. The close of the connection waits for RabbitMQ's
    answer ``min(timeout, CLOSE_TIMEOUT)`` at most, then drops the socket.

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
            failure = _publish(target, pending, confirmed, window=window, timeout=timeout)
            if failure is not None:
                raise BulkSendError(failure[0], _other_than(pending, confirmed), confirmed, failure[1])
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
    broker: RabbitmqBroker,
    pending: list[Message[Any]],
    confirmed: list[Message[Any]],
    *,
    window: int,
    timeout: float,
) -> tuple[str, str] | None:
    """Run the ``before_enqueue`` hooks, encode, declare the queues, and publish on the first node
    that accepts a connection. Appends the messages RabbitMQ confirmed to ``confirmed`` and runs
    their ``after_enqueue`` hooks, an interrupt included (the caller gives back the others' keys);
    returns why not all were confirmed and the class of that failure, or None."""
    for message in pending:
        broker.emit_before("enqueue", message, None)
    # Every body before the first publish (the hooks may change options): nothing goes out if one fails.
    bodies = [message.encode() for message in pending]
    for queue_name in {m.queue_name for m in pending}:
        broker.declare_queue(queue_name, ensure=True)
    nodes = broker.parameters if isinstance(broker.parameters, list) else [broker.parameters]
    close_timeout = min(timeout, CLOSE_TIMEOUT)
    for position, node in enumerate(nodes, start=1):
        publisher = Publisher(
            pending, bodies, parameters=node, window=window, timeout=timeout, close_timeout=close_timeout
        )
        try:
            publisher.run()
        finally:  # interrupted too: what RabbitMQ confirmed is enqueued (a node passed over has none)
            sent = publisher.sent()
            confirmed += sent
            for message in sent:
                broker.emit_after("enqueue", message, None)
        if publisher.opened:  # something may have been published: never again elsewhere
            break
        log_failure(  # the node by its place in the URL's list: its address goes at DEBUG only
            logger,
            logging.WARNING,
            "bulk_send_node_unreachable",
            publisher.error or "",
            private={"host": node.host, "port": node.port},
            node=position,
            nodes=len(nodes),
            error=publisher.error_class,
        )
    if len(confirmed) == len(pending):
        return None
    if publisher.error is not None:
        return publisher.error, publisher.error_class or "unknown"
    return ("unroutable", "unroutable") if publisher.returned_ids else ("nacked by RabbitMQ", "nacked")


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
