"""Build the RabbitMQ broker from settings: confirms on, durable queues, priorities, explicit timeouts."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.middleware import Middleware

from actors.settings import Settings


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


def build_broker(settings: Settings, middleware: list[Middleware]) -> RabbitmqBroker:
    """A broker whose every publish waits for RabbitMQ's confirm and whose queues take priorities.

    Dramatiq declares its queues durable and publishes persistent messages (delivery mode 2);
    ``confirm_delivery`` makes a publish to a missing queue or during a broker failure an error
    instead of a silent loss.
    """
    return RabbitmqBroker(
        url=connection_urls(settings),
        confirm_delivery=True,
        max_priority=settings.rabbitmq_max_priority,
        middleware=middleware,
    )
