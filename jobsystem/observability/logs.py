"""One logging set-up for the worker processes, the scheduler and ``jobctl``.

structlog renders every event; records of the standard library's loggers (Dramatiq, pika,
APScheduler) pass through the same processors via ``ProcessorFormatter``. pika's own lines quote
RabbitMQ's host and port: those Sentry would take show their values by class, the whole line at
DEBUG (:mod:`jobsystem.observability.pika_lines`). Under ``dramatiq actors``
each worker process has already pointed the root logger at the pipe to its parent: the existing
handlers are kept and only their formatter and filters are replaced, so the parent prints finished
lines.

Personal data is removed twice over: on each root handler, filters hide Dramatiq's message
arguments and scrub a standard-library record's message before anything formats it (Sentry's
logging integration reads the record after these handlers); in the formatter, the scrubber runs
over the whole event after the traceback is formatted, just before rendering.

The lifecycle events of every job (``job_started``, ``job_succeeded``) take a short path to the
same handlers' streams (:mod:`jobsystem.observability.direct_lines`), and ``JobLifecycle`` makes
their lines without a pass through the chain (:mod:`jobsystem.observability.job_lines`, installed
here); JSON is rendered by orjson.
In a worker process they are sent to the parent in batches
(:mod:`jobsystem.observability.batched_stream`).
"""

from __future__ import annotations

import logging
import sys
import threading
from types import TracebackType
from typing import Any

import structlog
from dramatiq.compat import StreamablePipe
from structlog.typing import Processor

from jobsystem.dramatiq_internals import RESULTS_MISSING_WARNING
from jobsystem.observability.batched_stream import BatchedStream
from jobsystem.observability.direct_lines import DirectLines, json_renderer
from jobsystem.observability.formatter_extras import drop_formatter_extras
from jobsystem.observability.job_lines import JobLines, install_job_lines
from jobsystem.observability.pika_lines import install_pika_lines
from jobsystem.privacy.message_logs import HideMessageArguments
from jobsystem.privacy.scrub import Scrubber
from jobsystem.privacy.setup import get_scrubber
from jobsystem.runtime.cancellation import JobCancelled
from jobsystem.settings import Settings
from middleware.lifecycle import DEFAULT_LOGGER as LIFECYCLE_LOGGER


def _renderer(log_format: str) -> Processor:
    if log_format == "json":
        return json_renderer()
    return structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())


def _log_uncaught(
    exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None, where: str
) -> None:
    structlog.get_logger("uncaught").critical("uncaught_exception", where=where, exc_info=(exc_type, exc, tb))


def _route_uncaught_exceptions() -> None:
    """Tracebacks Python would print to stderr go through the processors (and the scrubber)."""

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_value is not None:
            where = args.thread.name if args.thread else "thread"
            _log_uncaught(args.exc_type, args.exc_value, args.exc_traceback, where)

    def process_hook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if issubclass(exc_type, KeyboardInterrupt):
            sys.__excepthook__(exc_type, exc, tb)  # Ctrl-C: no personal data, no alarm
        else:
            _log_uncaught(exc_type, exc, tb, "main")

    threading.excepthook = thread_hook
    sys.excepthook = process_hook


def configure_logging(
    settings: Settings, *, scrubber: Scrubber | None = None, extra_processors: list[Processor] | None = None
) -> None:
    """Route structlog and standard-library records through one chain of processors, scrubbed."""
    scrubber = scrubber or get_scrubber(settings)
    level = logging.getLevelName(settings.log_level)
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.stdlib.ExtraAdder(),
        drop_formatter_extras,  # uvicorn's ``color_message``
        *(extra_processors or []),
    ]
    # What turns an event into a line: after the traceback is text, scrubbed, before rendering.
    renderer = _renderer(settings.log_format)
    finish: list[Processor] = [structlog.processors.format_exc_info, scrubber.processor, renderer]
    direct = DirectLines([LIFECYCLE_LOGGER], finish, allowed_filters=(HideMessageArguments, Scrubber))
    chain: list[Processor] = [
        structlog.stdlib.filter_by_level,
        *shared,
        structlog.processors.StackInfoRenderer(),
        direct,
        structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
    ]
    # JobLines mirrors this chain as it is here: extra processors would be skipped, so none then.
    install_job_lines(None if extra_processors else JobLines(chain, direct, scrubber, renderer))
    structlog.configure(
        processors=chain,
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *finish],
    )
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.StreamHandler(sys.stderr))
    for handler in root.handlers:
        _batch_pipe(handler)
        handler.setFormatter(formatter)
        for old in [f for f in handler.filters if isinstance(f, (HideMessageArguments, Scrubber))]:
            handler.removeFilter(old)
        handler.addFilter(HideMessageArguments())  # needs the Message objects: before the scrubber
        handler.addFilter(scrubber)
    root.setLevel(level)
    install_pika_lines(level)
    worker_log = logging.getLogger("dramatiq.worker.WorkerThread")
    if not any(isinstance(f, _ResultsAreKept) for f in worker_log.filters):
        worker_log.addFilter(_ResultsAreKept())
    if not any(isinstance(f, _CancelledIsNoFailure) for f in worker_log.filters):
        worker_log.addFilter(_CancelledIsNoFailure())
    logging.captureWarnings(True)
    _route_uncaught_exceptions()


def _batch_pipe(handler: logging.Handler) -> None:
    """Under ``dramatiq``, wrap the handler's pipe to the parent process in a :class:`BatchedStream`
    (lifecycle lines go in batches; everything else at once, after what is pending). The worker
    process's ``sys.stdout`` and ``sys.stderr`` are the same pipe: they get the same wrapper, so a
    ``print`` cannot overtake pending lines. Other streams (a terminal, a file, a test's) are kept."""
    if type(handler) is not logging.StreamHandler or type(handler.stream) is not StreamablePipe:
        return
    pipe = handler.stream
    batched = BatchedStream(pipe)
    handler.setStream(batched)
    if sys.stdout is pipe:
        sys.stdout = batched
    if sys.stderr is pipe:
        sys.stderr = batched


class _ResultsAreKept(logging.Filter):
    """Drop Dramatiq's warning, on every job that returns a value, that its Results middleware is
    missing: this project keeps results itself (idempotency records, job status)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return RESULTS_MISSING_WARNING not in str(record.msg)


class _CancelledIsNoFailure(logging.Filter):
    """Drop Dramatiq's ERROR "Failed to process message" (with its traceback) for a job that was
    interrupted because it was cancelled: the job is logged as ``job_cancelled``, not failed."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], JobCancelled))


def get_logger(name: str, **context: Any) -> structlog.stdlib.BoundLogger:
    """A structlog logger named like a module, with optional bound context."""
    logger: structlog.stdlib.BoundLogger = structlog.get_logger(name)
    return logger.bind(**context) if context else logger
