"""What RabbitMQ holds open for a broker of the test's: the broker's connections carry a name of
the test's (the client-provided ``connection_name``, which the management API lists as
``user_provided_name``), and the management API counts them."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import pika
import requests

from jobsystem.rabbitmq.broker import connection_urls
from jobsystem.settings import Settings
from tests.support import wait_for

__all__ = ["held_open", "name_connections", "named_url"]


def named_url(settings: Settings, name: str) -> str:
    """The AMQP URL with a connection name, by which the management API finds the connection (a
    process given it as ``RABBITMQ_URL`` names each connection it opens so)."""
    url = connection_urls(settings)[0]
    return f"{url}{'&' if '?' in url else '?'}client_properties={quote(repr({'connection_name': name}))}"


def name_connections(broker: Any, name: str) -> None:
    """Give every connection ``broker`` opens from now on (one per thread, and those of its
    readers and bulk sends) the client-provided name ``name``."""
    nodes = broker.parameters if isinstance(broker.parameters, list) else [broker.parameters]
    for node in nodes:
        node.client_properties = {"connection_name": name}


def _listed(settings: Settings) -> list[str | None]:
    """The client-provided name of each connection RabbitMQ lists now."""
    response = requests.get(
        settings.management_api("connections"),
        params={"columns": "name,user_provided_name"},
        auth=settings.management_auth,
        timeout=10,
    )
    response.raise_for_status()
    return [connection.get("user_provided_name") for connection in response.json()]


def held_open(settings: Settings, name: str) -> int:
    """How many connections named ``name`` RabbitMQ holds open now.

    The management API lists a connection only a few seconds after it opened (its statistics
    are collected on a timer), so a count taken at once misses those just opened. A marker
    connection is opened first, and the count is taken once the API lists it: every connection
    opened before it is listed by then (the marker itself is not counted)."""
    marker_name = f"{name}-marker"
    parameters = pika.URLParameters(settings.rabbitmq_url.split(";")[0])
    parameters.client_properties = {"connection_name": marker_name}
    marker = pika.BlockingConnection(parameters)

    def with_marker() -> list[str | None] | None:
        listed = _listed(settings)
        return listed if marker_name in listed else None

    try:
        names: list[str | None] = wait_for(
            with_marker, timeout=30, interval=0.5, what="the marker connection in the management API"
        )
    finally:
        marker.close()
    return names.count(name)
