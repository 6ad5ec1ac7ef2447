"""Sentry's trace headers in a Dramatiq message, without the DSN's key.

The SDK's Dramatiq integration writes ``_sentry_headers`` (``sentry-trace`` and ``baggage``) into
each message's options as it is enqueued, so that the worker's error event joins the sender's
trace. Its ``baggage`` also names ``sentry-public_key``, the key of ``SENTRY_DSN``, and
``sentry-org_id``, read from the DSN's host: a message's options sit in RabbitMQ, in dead letters
kept until purged, in exports and in ``jobctl dlq show``. Joining a trace needs only its id (in
``sentry-trace``, and ``sentry-trace_id`` in the baggage), so those two members are taken out of
the baggage as the integration writes it. Headers of a shape not understood are dropped whole:
that message's error joins no trace, and carries nothing of the DSN.
"""

from __future__ import annotations

from typing import Any

from dramatiq import Broker, Message
from sentry_sdk.integrations.dramatiq import SentryMiddleware
from sentry_sdk.tracing import BAGGAGE_HEADER_NAME

__all__ = ["DSN_MEMBERS", "keep_dsn_out_of_messages", "without_dsn"]

#: The baggage members read from the DSN.
DSN_MEMBERS = frozenset({"sentry-public_key", "sentry-org_id"})
HEADERS = SentryMiddleware.SENTRY_HEADERS_NAME


def without_dsn(baggage: str | None) -> str | None:
    """``baggage`` (a W3C baggage header) without :data:`DSN_MEMBERS`; None when nothing is left."""
    if baggage is None:
        return None
    if not isinstance(baggage, str):
        raise TypeError(f"baggage is a {type(baggage).__name__}")
    members = [m for m in baggage.split(",") if m.split("=", 1)[0].strip() not in DSN_MEMBERS]
    return ",".join(members) or None


def _drop_dsn(message: Message[Any]) -> None:
    """``message``'s trace headers without the DSN's members; dropped whole when not understood."""
    headers = message.options.get(HEADERS)
    if headers is None:
        return
    try:
        headers[BAGGAGE_HEADER_NAME] = without_dsn(headers.get(BAGGAGE_HEADER_NAME))
    except Exception:  # not the integration's dict of strings: nothing of it goes
        del message.options[HEADERS]


def keep_dsn_out_of_messages() -> None:
    """Make the integration's ``before_enqueue`` leave the DSN out (once a process: idempotent).

    Its middleware is added to every broker as it is built, with no hook of its own to shape the
    headers, so its method is wrapped: every broker of the process, a user's own too, is covered.
    """
    original = SentryMiddleware.before_enqueue
    if getattr(original, "keeps_dsn_out", False):
        return

    def before_enqueue(self: SentryMiddleware, broker: Broker, message: Message[Any], delay: int) -> None:
        original(self, broker, message, delay)
        _drop_dsn(message)

    before_enqueue.keeps_dsn_out = True  # type: ignore[attr-defined]
    SentryMiddleware.before_enqueue = before_enqueue  # type: ignore[method-assign]
