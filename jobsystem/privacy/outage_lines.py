"""A log line about a dependency that failed (the state store, RabbitMQ, the management API, an SMTP
server): the error's class at the line's level, the error's own text at DEBUG only.

Sentry's logging integration makes an event of every ERROR line and a breadcrumb of every INFO
and WARNING one. An error's text names hosts and ports (``Error 111 connecting to 10.0.0.5:6379``)
and may quote a server's reply: sent with the line, the infrastructure's addresses reached Sentry
on every outage. So the line says ``error=StoreUnavailable`` and a twin, ``<event>_cause`` at
DEBUG with the same fields, carries the text (``LOG_LEVEL=DEBUG`` shows it; the log is scrubbed).
The health check's own words (:func:`jobsystem.ops.outages.reason`) follow the same rule.

Every store failure is a ``StoreUnavailable``, which alone would not tell a refused connection
from a timeout or a full, read-only or busy Redis: the line adds ``cause``, the class of the
error the store's error wraps (``ConnectionError``, ``TimeoutError``, ``ResponseError``), and for
a Redis error reply ``code``, its first word (``OOM``, ``READONLY``, ``BUSY``). Neither names an
address; the reply's text stays in the DEBUG twin.

A line that is no failure follows the same rule (every INFO line is a breadcrumb too): a worker's
``state_store_ready`` or a service's start names the store or broker by its setting and kind, and
``<event>_addresses`` at DEBUG (:func:`log_addresses`) says where they are.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import structlog

from jobsystem.store.failures import WRAPPERS, reply_code, wrapped

__all__ = [
    "ADDRESSES_SUFFIX",
    "CAUSE_SUFFIX",
    "WRAPPERS",
    "failure_fields",
    "log_addresses",
    "log_failure",
    "log_outage",
]

#: The DEBUG twin of a line ``event`` is ``event + CAUSE_SUFFIX``.
CAUSE_SUFFIX = "_cause"

#: The DEBUG line with the addresses a line ``event`` leaves out: ``event + ADDRESSES_SUFFIX``.
ADDRESSES_SUFFIX = "_addresses"

# The wrapped error and a reply's code are read by jobsystem.store.failures, which also tells a
# writer whether a failure passes: one parser for both.


def failure_fields(exc: BaseException) -> dict[str, str]:
    """The fields naming ``exc`` at a line's own level: ``error`` (its class), ``cause`` (the class
    of the error it wraps, when a wrapper) and ``code`` (a Redis error reply's), never a text."""
    fields = {"error": type(exc).__name__}
    cause = wrapped(exc)
    if cause is not None:
        fields["cause"] = type(cause).__name__
    code = reply_code(exc if cause is None else cause)
    if code is not None:
        fields["code"] = code
    return fields


def log_failure(
    logger: logging.Logger | structlog.stdlib.BoundLogger,
    level: int,
    event: str,
    text: str,
    *,
    private: Mapping[str, Any] | None = None,
    **fields: Any,
) -> None:
    """Log ``event`` at ``level`` with ``fields``, which name the failure without an address (its
    ``error`` by class), then ``<event>_cause`` at DEBUG with the same fields, ``error`` = ``text``
    and ``private`` (what names the dependency's address: kept out of Sentry).

    ``logger`` is a standard-library logger (fields go in ``extra``) or a structlog one."""
    _log(logger, level, event, fields)
    _log(logger, logging.DEBUG, event + CAUSE_SUFFIX, {**fields, **(private or {}), "error": text})


def log_outage(
    logger: logging.Logger | structlog.stdlib.BoundLogger,
    level: int,
    event: str,
    exc: BaseException,
    **fields: Any,
) -> None:
    """Log ``event`` at ``level`` with ``fields`` and :func:`failure_fields` (``error`` = the class
    name of ``exc``, its ``cause`` and ``code``), then ``<event>_cause`` at DEBUG with the same
    fields and ``error`` = the text of ``exc`` (see :func:`log_failure`)."""
    log_failure(logger, level, event, str(exc), **{**fields, **failure_fields(exc)})


def log_addresses(
    logger: logging.Logger | structlog.stdlib.BoundLogger, event: str, **addresses: Any
) -> None:
    """``<event>_addresses`` at DEBUG: where a line ``event`` (a start, a store found ready) names
    its dependencies by setting and kind, the addresses an operator may still want to read.
    Sentry takes INFO and WARNING lines as breadcrumbs, never DEBUG ones."""
    _log(logger, logging.DEBUG, event + ADDRESSES_SUFFIX, addresses)


def _log(
    logger: logging.Logger | structlog.stdlib.BoundLogger, level: int, event: str, fields: dict[str, Any]
) -> None:
    if isinstance(logger, logging.Logger):
        logger.log(level, event, extra=fields)
    else:
        logger.log(level, event, **fields)
