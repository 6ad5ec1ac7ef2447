"""One logging set-up for the worker processes, the scheduler and ``jobctl``.

structlog renders every event; records of the standard library's loggers (Dramatiq, pika,
APScheduler) pass through the same processors via ``ProcessorFormatter``. Under ``dramatiq actors``
each worker process has already pointed the root logger at the pipe to its parent: the existing
handlers are kept and only their formatter is replaced, so the parent prints finished lines.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog
from structlog.typing import Processor

from actors.settings import Settings


def _renderer(log_format: str) -> Processor:
    if log_format == "json":
        return structlog.processors.JSONRenderer()
    return structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())


def configure_logging(settings: Settings, *, extra_processors: list[Processor] | None = None) -> None:
    """Route structlog and standard-library records through one chain of processors."""
    level = logging.getLevelName(settings.log_level)
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.stdlib.ExtraAdder(),
        *(extra_processors or []),
    ]
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *shared,
            structlog.processors.StackInfoRenderer(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            _renderer(settings.log_format),
        ],
    )
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.StreamHandler(sys.stderr))
    for handler in root.handlers:
        handler.setFormatter(formatter)
    root.setLevel(level)
    # pika is chatty at INFO about every connection; keep its warnings and errors.
    logging.getLogger("pika").setLevel(max(level, logging.WARNING))


def get_logger(name: str, **context: Any) -> structlog.stdlib.BoundLogger:
    """A structlog logger named like a module, with optional bound context."""
    logger: structlog.stdlib.BoundLogger = structlog.get_logger(name)
    return logger.bind(**context) if context else logger
