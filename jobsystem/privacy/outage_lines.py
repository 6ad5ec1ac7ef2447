"""A log line about a dependency that failed (the state store, RabbitMQ, the management API, an SMTP
server): the error's class at the line's level, the error's own text at DEBUG only.

Sentry's logging integration makes an event of every ERROR line and a breadcrumb of every INFO
and WARNING one. An error's text names hosts and ports (``Error 111 connecting to 10.0.0.5:6379``)
and may quote a server's reply: sent with the line, the infrastructure's addresses reached Sentry
on every outage. So the line says ``error=StoreUnavailable`` and a twin, ``<event>_cause`` at
DEBUG with the same fields, carries the text (``LOG_LEVEL=DEBUG`` shows it; the log is scrubbed).
The health check's own words (:func:`jobsystem.ops.outages.reason`) follow the same rule.
"""

from __future__ import annotations

import logging
from typing import Any

import structlog

__all__ = ["CAUSE_SUFFIX", "log_outage"]

#: The DEBUG twin of a line ``event`` is ``event + CAUSE_SUFFIX``.
CAUSE_SUFFIX = "_cause"


def log_outage(
    logger: logging.Logger | structlog.stdlib.BoundLogger,
    level: int,
    event: str,
    exc: BaseException,
    **fields: Any,
) -> None:
    """Log ``event`` at ``level`` with ``fields`` and ``error`` = the class name of ``exc``, then
    ``<event>_cause`` at DEBUG with the same fields and ``error`` = the text of ``exc``.

    ``logger`` is a standard-library logger (fields go in ``extra``) or a structlog one."""
    said, cause = {**fields, "error": type(exc).__name__}, {**fields, "error": str(exc)}
    if isinstance(logger, logging.Logger):
        logger.log(level, event, extra=said)
        logger.debug(event + CAUSE_SUFFIX, extra=cause)
    else:
        logger.log(level, event, **said)
        logger.debug(event + CAUSE_SUFFIX, **cause)
