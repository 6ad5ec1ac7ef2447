"""Build the RabbitMQ broker from settings: confirms on, durable queues, priorities, explicit timeouts."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from dramatiq import Message
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.middleware import Middleware

from actors.settings import Settings
from middleware.idempotency import DuplicateMessage, as_duplicate


class ProjectBroker(RabbitmqBroker):
    """Dramatiq's RabbitMQ broker, where a send dropped as a duplicate returns the original id.

    The idempotency middleware refuses a duplicate by raising from ``before_enqueue``; here the
    refusal becomes the answer BullMQ gives for a known ``jobId``: the message, carrying the id of
    the message first sent with that key and the option ``duplicate=True``.
    """

    def enqueue(self, message: Message[Any], *, delay: int | None = None) -> Message[Any]:
        try:
            return super().enqueue(message, delay=delay)
        except DuplicateMessage as duplicate:
            return as_duplicate(message, duplicate.original_message_id)


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


def build_broker(settings: Settings, middleware: list[Middleware]) -> ProjectBroker:
    """A broker whose every publish waits for RabbitMQ's confirm and whose queues take priorities.

    Dramatiq declares its queues durable and publishes persistent messages (delivery mode 2);
    ``confirm_delivery`` makes a publish to a missing queue or during a broker failure an error
    instead of a silent loss.
    """
    return ProjectBroker(
        url=connection_urls(settings),
        confirm_delivery=True,
        max_priority=settings.rabbitmq_max_priority,
        middleware=middleware,
    )
