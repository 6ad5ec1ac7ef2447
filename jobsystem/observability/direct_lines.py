"""A short path for the busiest log events: rendered with ``orjson`` and written straight to the stream.

A job logs ``job_started`` and ``job_succeeded``. Through the standard library each costs a
``LogRecord``, a caller lookup, the handlers' filters, a copy of the record in structlog's
``ProcessorFormatter`` and ``json.dumps``: about 40 µs per event here. :class:`DirectLines` finishes
such an event itself, with the same final processors (exception text, the scrubber, the renderer),
and writes the line to the root logger's stream handlers under their locks, so the output is the
same line in the same place. It takes only events below WARNING of the loggers it is given (the
lifecycle logger, which Sentry ignores), and only while every root handler is a plain
``logging.StreamHandler`` (what ``dramatiq`` and the command line set up); anything else, such as a
capture handler in a test, gets the ordinary path. Where the handler's stream is a
:class:`~jobsystem.observability.batched_stream.BatchedStream` (a worker process's pipe to
Dramatiq's parent), the line is queued there and sent with others, without the handler's lock.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Sequence
from functools import cache, partial
from typing import Any

import orjson
import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

from jobsystem.observability.batched_stream import BatchedStream

__all__ = ["DirectLines", "dumps", "json_renderer"]

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO}


def dumps(obj: Any, default: Callable[[Any], Any] | None = None, **_: Any) -> str:
    """JSON text of ``obj`` by orjson (non-string keys allowed), or by ``json`` for what orjson
    refuses (an integer beyond 64 bits)."""
    try:
        return orjson.dumps(obj, default=default, option=orjson.OPT_NON_STR_KEYS).decode()
    except (TypeError, orjson.JSONEncodeError):
        return json.dumps(obj, default=default)


def json_renderer() -> Processor:
    """structlog's JSON renderer with :func:`dumps` as its serializer."""
    return structlog.processors.JSONRenderer(serializer=dumps)


def _terminated(line: Callable[[], str], terminator: str) -> str:
    return f"{line()}{terminator}"


class DirectLines:
    """structlog processor, placed just before ``ProcessorFormatter.wrap_for_formatter``.

    Parameters:
      loggers: names of the loggers whose DEBUG and INFO events take the short path.
      tail: the processors that finish an event into a line (those of the formatter).
      allowed_filters: handler filters the short path may skip (they only act on standard-library
        records, and the tail does the same work); a handler with another filter disables it.
    """

    def __init__(
        self, loggers: Iterable[str], tail: Sequence[Processor], allowed_filters: tuple[type, ...] = ()
    ) -> None:
        self.loggers = frozenset(loggers)
        self.tail = tuple(tail)
        self.allowed_filters = allowed_filters

    def streams(self, level: int) -> list[logging.StreamHandler[Any]] | None:
        """The root handlers when the short path may write an event of ``level`` to them, else ``None``."""
        handlers = logging.root.handlers
        allowed = self.allowed_filters
        for handler in handlers:
            if type(handler) is not logging.StreamHandler or handler.level > level:
                return None
            for f in handler.filters:
                if not isinstance(f, allowed):
                    return None
        return handlers or None  # type: ignore[return-value]

    def write(self, line: str, handlers: list[logging.StreamHandler[Any]]) -> None:
        """Write a finished ``line`` to ``handlers``' streams (from :meth:`streams`)."""
        for handler in handlers:
            stream = handler.stream
            if type(stream) is BatchedStream:  # its own lock keeps the order with the handler's writes
                stream.write_later(f"{line}{handler.terminator}")
                continue
            handler.acquire()
            try:
                stream.write(f"{line}{handler.terminator}")
                handler.flush()
            except Exception:  # as logging does: a broken stream does not break the job
                pass
            finally:
                handler.release()

    @staticmethod
    def write_later(make_line: Callable[[], str], handlers: list[logging.StreamHandler[Any]]) -> bool:
        """Queue a line made when its batch is sent (``make_line``, called once whatever the number
        of streams), where every one of ``handlers``' streams is a :class:`BatchedStream` with
        nothing pending: the first line of a batch (an idle worker's ``job_started``, on the way
        to its actor). Else ``False``, and nothing is queued: under load, lines made at send time
        cost 60-90 µs more worker CPU per job than lines made at once."""
        if any(type(h.stream) is not BatchedStream or h.stream.pending for h in handlers):
            return False
        once = cache(make_line)
        for handler in handlers:
            handler.stream.write_later(partial(_terminated, once, handler.terminator))
        return True

    def __call__(self, logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
        level = _LEVELS.get(method_name)
        if level is None or event_dict.get("logger") not in self.loggers:
            return event_dict
        handlers = self.streams(level)
        if handlers is None:
            return event_dict
        line: Any = event_dict
        for processor in self.tail:
            line = processor(logger, method_name, line)
        self.write(line, handlers)
        raise structlog.DropEvent
