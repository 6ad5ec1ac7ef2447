"""What the consumer's dead letters carry of the delivery: the final message without Dramatiq's
stored traceback, or a malformed body's AMQP properties and plain headers that stay harmless."""

from __future__ import annotations

import dataclasses
from typing import Any

import pika.spec
from dramatiq import Message
from dramatiq.common import q_name

from jobsystem.dramatiq_internals import ProjectMessage

__all__ = ["KEPT_PROPERTIES", "dead_letter_body", "kept_properties"]

#: AMQP properties of a malformed delivery that its dead letter keeps (others, such as
#: ``expiration`` or ``user_id``, would change what happens to the dead letter itself).
KEPT_PROPERTIES = ("content_type", "content_encoding", "correlation_id", "app_id", "type", "timestamp")


def dead_letter_body(message: ProjectMessage) -> bytes:
    """The message as it goes to the dead letters: without Dramatiq's stored traceback (the
    previous attempt's, unscrubbed); the record's headers carry the final one."""
    options = {k: v for k, v in message.options.items() if k not in ("traceback", "eta")}
    final: Message[Any] = dataclasses.replace(
        message.message, queue_name=q_name(message.queue_name), options=options
    )
    return final.encode()


def kept_properties(properties: pika.spec.BasicProperties) -> tuple[dict[str, Any], dict[str, Any]]:
    """The AMQP properties and the plain headers of a malformed delivery that its dead letter keeps."""
    kept = {name: getattr(properties, name) for name in KEPT_PROPERTIES if getattr(properties, name)}
    headers = {
        str(k): v
        for k, v in (properties.headers or {}).items()
        if not str(k).startswith("x-dl-") and isinstance(v, str | int | float | bytes)
    }
    return kept, headers
