"""The lifecycle lines of every job, made without a pass through structlog's chain of processors.

Each job logs ``job_started`` and ``job_succeeded``. Through ``BoundLogger.info``, the chain that
:func:`~jobsystem.observability.logs.configure_logging` sets up and its short end
(:class:`~jobsystem.observability.direct_lines.DirectLines`), each cost about 10 µs of CPU in-process
(25 µs in a profile of a loaded worker): nine processor calls, a ``datetime`` for the timestamp,
the scrubber over every entry of every event. :class:`JobLines` makes the same line in about 7 µs
(``python -m bench.lifecycle_logs``), half of it writing and rendering:

- the event dict by the chain's own steps, in its order: the keyword fields, ``event``, structlog's
  ``filter_by_level``, ``merge_contextvars`` (as :class:`BoundContext`: whatever else is bound
  comes along, as it would), ``add_log_level`` and ``add_logger_name``; then the timestamp, by
  :class:`IsoStamps`;
- scrubbed by a :class:`~jobsystem.privacy.scrub_memo.ScrubMemo`: the scrubber's result, entry for
  entry, but a string already scrubbed under the same key on this thread is not scanned again;
- rendered by the chain's renderer and written by ``DirectLines`` (the same streams, in order).

In a worker process, whose streams batch lines (``jobsystem.observability.batched_stream``), the
first line of a batch waits for the last two steps until the batch's send: it is queued as what
makes it, and scrubbed and rendered when the batch leaves (on the flusher thread, 50 ms later at
most, or on the thread that sends it sooner). That is an idle worker's ``job_started``, which then
costs the job's start only the event dict: with every step running on cold caches, scrubbing and
rendering it took about a fifth of a millisecond of the send -> start latency. Lines that join a
batch already pending (a busy worker's) are made at once: made at send time they cost 60-90 µs
more worker CPU per job. Only events whose values cannot change meanwhile (strings, numbers,
booleans, ``None``) wait; the others are made at once.

What the scrubber sees: everything but the timestamp. The message id comes with the message (any
producer may put any text there): scanned once per job, on its first line. Actor and queue names
are chosen by developers (a name could hold anything; ``JobLifecycle`` gives the actor of a message
naming no registered actor as ``unknown``, not the sender's text): scanned, once per thread for as
long as they repeat. The attempt and ``duration_ms`` are numbers, which the scrubber passes as they are
(unless an operator named their key). The timestamp is made here from the clock, digits and
separators only: not given to the scrubber, unless an operator named its key.

It takes an event only where the chain would have handed it to ``DirectLines`` as it is: structlog
runs exactly the chain :class:`JobLines` was made with (not ``capture_logs``, not reset or
reconfigured), ``DirectLines`` would take it (its conditions on the root handlers), and no entry is
one that the processors in between act on (``exc_info``, ``stack_info``, ``_record``). Otherwise
the caller logs it the ordinary way. Below the logger's level it writes nothing, as the chain would.

``configure_logging`` installs one; :func:`write_job_line` (what the stack hands ``JobLifecycle``)
writes through the one installed.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import logging
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import structlog
from structlog.contextvars import STRUCTLOG_KEY_PREFIX, STRUCTLOG_KEY_PREFIX_LEN
from structlog.stdlib import add_log_level, add_logger_name, filter_by_level
from structlog.typing import Processor

from jobsystem.observability.direct_lines import DirectLines
from jobsystem.observability.formatter_extras import FORMATTER_EXTRAS
from jobsystem.privacy.scrub import Scrubber
from jobsystem.privacy.scrub_memo import ScrubMemo

__all__ = ["BoundContext", "IsoStamps", "JobLines", "install_job_lines", "write_job_line"]

#: Entries that processors of the chain not called here act on: ExtraAdder (``_record``),
#: drop_formatter_extras (``color_message``), StackInfoRenderer (``stack_info``), DirectLines'
#: format_exc_info (``exc_info``).
_CHAIN_KEYS = frozenset({"exc_info", "stack_info", "_record"}) | FORMATTER_EXTRAS
#: Entries :class:`JobLines` makes from no input.
_MADE_HERE = frozenset({"timestamp"})
#: Types of the values an event may hold to be scrubbed and rendered later: none can change meanwhile.
_UNCHANGING = frozenset({str, int, float, bool, type(None)})


class BoundContext:
    """structlog's ``merge_contextvars``, entry for entry and in its order, at half the cost.

    structlog walks every context variable of the thread (Sentry's, Dramatiq's, the project's
    as well as its own) and tests each name for its prefix, then looks each of its own up
    again. Here the walk reads each value once, and what a variable's name means (its key, or
    not structlog's) is kept per variable: a ``ContextVar``'s name never changes. The kept
    names are dropped past ``max_vars`` (a program that makes variables on the fly).
    """

    def __init__(self, max_vars: int = 1024) -> None:
        self.max_vars = max_vars
        self._keys: dict[contextvars.ContextVar[Any], str | None] = {}

    def __call__(self, logger: Any, method_name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
        keys = self._keys
        for var, value in contextvars.copy_context().items():
            key = keys.get(var, _UNSEEN)
            if key is _UNSEEN:
                if len(keys) >= self.max_vars:
                    keys.clear()
                name = var.name
                key = keys[var] = (
                    name[STRUCTLOG_KEY_PREFIX_LEN:] if name.startswith(STRUCTLOG_KEY_PREFIX) else None
                )
            if key is not None and value is not Ellipsis:
                event_dict.setdefault(key, value)
        return event_dict


#: What :class:`BoundContext` has not seen yet (``None`` means: not one of structlog's).
_UNSEEN: Any = object()


class IsoStamps:
    """Timestamps as structlog's ``TimeStamper(fmt="iso", utc=True)`` writes them, formatting the
    date and time once a second: ``datetime.now(timezone.utc).isoformat()`` with ``Z`` for
    ``+00:00``, so six digits of microseconds, or none at all on a whole second.

    Parameters:
      clock: nanoseconds since the epoch (``datetime.now`` reads the same clock and truncates it
        to microseconds).
    """

    def __init__(self, clock: Callable[[], int] = time.time_ns) -> None:
        self.clock = clock
        self._second: tuple[int, str] = (-1, "")

    def __call__(self) -> str:
        seconds, micros = divmod(self.clock() // 1000, 1_000_000)
        second, prefix = self._second  # one tuple: threads that race each see a consistent pair
        if second != seconds:
            prefix = dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat().removesuffix("+00:00")
            self._second = (seconds, prefix)
        return f"{prefix}.{micros:06d}Z" if micros else f"{prefix}Z"


class JobLines:
    """Write lifecycle events as the chain ending in ``direct`` would; see the module's docstring.

    Parameters:
      chain: the processors structlog was configured with (compared at every event).
      direct: the chain's ``DirectLines``: the loggers it serves, its streams and its writing.
      scrubber: the chain's scrubber.
      renderer: the chain's renderer (JSON or console).
      stamps: the timestamps.
    """

    def __init__(
        self,
        chain: Sequence[Processor],
        direct: DirectLines,
        scrubber: Scrubber,
        renderer: Processor,
        stamps: Callable[[], str] | None = None,
    ) -> None:
        self.chain = list(chain)  # a copy: capture_logs changes the configured list in place
        self.direct = direct
        self.memo = ScrubMemo(scrubber)
        self.renderer = renderer
        self.stamps = stamps or IsoStamps()
        self._loggers: dict[str, logging.Logger] = {}  # getLogger takes a lock; a logger is forever
        self.bound = BoundContext()

    def write(self, logger_name: str, event: str, fields: dict[str, Any]) -> bool:
        """Log the INFO event ``event`` of ``logger_name`` with ``fields``. ``True``: done (written,
        or below the logger's level); ``False``: the caller must log it the ordinary way."""
        if logger_name not in self.direct.loggers or structlog.get_config()["processors"] != self.chain:
            return False
        logger = self._loggers.get(logger_name)
        if logger is None:
            logger = self._loggers[logger_name] = logging.getLogger(logger_name)
        event_dict = {**fields, "event": event}
        try:
            filter_by_level(logger, "info", event_dict)
        except structlog.DropEvent:
            return True
        handlers = self.direct.streams(logging.INFO)
        if handlers is None:
            return False
        self.bound(logger, "info", event_dict)
        if not _CHAIN_KEYS.isdisjoint(event_dict):
            return False
        add_log_level(logger, "info", event_dict)
        add_logger_name(logger, "info", event_dict)
        event_dict["timestamp"] = self.stamps()
        unchanging = all(type(value) in _UNCHANGING for value in event_dict.values())
        if unchanging and self.direct.write_later(partial(self._line, logger, event_dict), handlers):
            return True
        try:
            scrubbed = self.memo.mapping(event_dict, made_here=_MADE_HERE)
        except Exception:  # the ordinary path scrubs the event whole (and replaces what it must)
            return False
        line: Any = self.renderer(logger, "info", scrubbed)  # str, from either renderer
        self.direct.write(line, handlers)
        return True

    def _line(self, logger: logging.Logger, event_dict: dict[str, Any]) -> str:
        """The event scrubbed and rendered when its batch is sent: as :meth:`write` does, or, where
        the memo cannot scrub it entry by entry, scrubbed whole, as the ordinary path would. It
        never raises (a batch's lines are made under the stream's lock, on whichever thread sends)."""
        try:
            scrubbed = self.memo.mapping(event_dict, made_here=_MADE_HERE)
        except Exception:
            scrubbed = self.memo.scrubber.mapping(event_dict)
        try:
            return str(self.renderer(logger, "info", scrubbed))
        except Exception:
            return str(self.renderer(logger, "info", {"event": "[unrenderable event]"}))


_installed: JobLines | None = None


def install_job_lines(lines: JobLines | None) -> None:
    """Make ``lines`` the ones :func:`write_job_line` writes through (``None``: none)."""
    global _installed
    _installed = lines


def write_job_line(logger_name: str, event: str, fields: dict[str, Any]) -> bool:
    """:meth:`JobLines.write` of the installed lines; ``False`` (the ordinary way) when there are none."""
    lines = _installed
    return lines is not None and lines.write(logger_name, event, fields)
