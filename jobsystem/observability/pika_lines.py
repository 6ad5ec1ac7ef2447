"""pika's own log lines, without the addresses they quote, wherever Sentry takes them.

A connection that cannot be opened makes pika log half a dozen ERROR lines ("Socket failed to
connect: <socket ... raddr=('10.0.0.5', 5672)>", "TCP Connection attempt failed: ...;
dest=(..., ('10.0.0.5', 5672))", "AMQPConnectionWorkflowFailed: ..."), and a lost one a few more:
each one a Sentry event through the SDK's logging integration, naming RabbitMQ's host and port.
The project's rule (:mod:`jobsystem.privacy.outage_lines`): a line at WARNING or above names a
failed dependency by its error's class, the error's text at DEBUG.

Which of pika's records quote an address cannot be told from the record, and dropping or lowering
them all would hide an outage from an operator who reads the log at INFO. So every pika record
that Sentry would take (INFO and above; pika's logger is kept at WARNING or above) keeps its level
and pika's own wording, each value in it shown by its class (``Socket failed to connect:
<socket>; error=111 (<str>)``, ``Connection workflow failed: AMQPConnectionWorkflowFailed``;
numbers as they are), and loses its traceback. A message pika formatted itself (no arguments:
``Illegal close(...) request on <SelectConnection ... params=...>``) is kept only while it is
words, else cut before its first value. The record as pika made it, still named after pika's
logger, goes first to the root logger's handlers at DEBUG through this module's logger, which
``LOG_LEVEL`` sets (``LOG_LEVEL=DEBUG`` shows it; Sentry takes nothing below INFO).

The handler sits on the ``pika`` logger: every pika module's logger propagates its records
through it before the root logger's handlers format them, and Sentry's integration reads a record
once all the handlers have run. A filter would not do: a logger's filters see only the records
logged on that very logger, not on its children.
"""

from __future__ import annotations

import logging
import re
from typing import Any

__all__ = ["PIKA_LOGGER", "PikaAddresses", "install_pika_lines", "shown_by_class", "summary"]

#: The parent of every pika module's logger.
PIKA_LOGGER = "pika"
#: What passes the whole records on at DEBUG: its level is the root logger's (``LOG_LEVEL``), where
#: pika's own is never below WARNING.
_WHOLE = logging.getLogger(__name__)
#: Values a message may show as they are: they name no host, port (as text) or reply.
_PLAIN = (bool, int, float, type(None))
#: A message of pika's own wording: words and punctuation, no value (a quote, ``<``, ``=``, digit).
_WORDS = re.compile(r"[A-Za-z_ .,;:()\-]*")
#: Put where a message's values were, when they cannot be shown by class.
_ELIDED = "[values at DEBUG]"


def shown_by_class(value: Any) -> str:
    """``value`` as a rewritten line shows it: a number as it is, anything else by its class
    (an exception: ``ConnectionRefusedError``; other values: ``<socket>``, ``<str>``)."""
    if isinstance(value, _PLAIN):
        return repr(value)
    if isinstance(value, BaseException):
        return type(value).__name__
    return f"<{type(value).__name__}>"


def summary(record: logging.LogRecord) -> str:
    """``record``'s message with every value shown by class (see the module docstring).

    A message with arguments is pika's format string (a literal in its code), filled with the
    values' classes. One without was formatted by pika itself: kept while it is words only,
    else cut before its first value."""
    text = str(record.msg)
    args = record.args if isinstance(record.args, tuple) else () if record.args is None else (record.args,)
    if args:
        try:
            return _conversions_as_text(text) % tuple(shown_by_class(arg) for arg in args)
        except (TypeError, ValueError):
            pass
    elif _WORDS.fullmatch(text):
        return text
    lead = _WORDS.match(text)
    return " ".join(part for part in ((lead[0] if lead else "").rstrip(" .,;:(-"), _ELIDED) if part)


def _conversions_as_text(template: str) -> str:
    """``template`` with each conversion (``%r``, ``%d``, ``%0.2f``) made ``%s``; ``%%`` kept."""
    return re.sub(
        r"%[#0\- +]*[0-9]*(?:\.[0-9]+)?([a-zA-Z%])", lambda m: "%%" if m[1] == "%" else "%s", template
    )


class PikaAddresses(logging.Handler):
    """Installed on the ``pika`` logger: see the module docstring."""

    def handle(self, record: logging.LogRecord) -> bool:
        """Send the record as it is at DEBUG (if that is logged), then rewrite it in place."""
        if record.levelno < logging.INFO:  # below what Sentry takes
            return False
        if _WHOLE.isEnabledFor(logging.DEBUG):
            _WHOLE.handle(
                logging.makeLogRecord({**record.__dict__, "levelno": logging.DEBUG, "levelname": "DEBUG"})
            )
        record.msg, record.args = summary(record), ()
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True

    def emit(self, record: logging.LogRecord) -> None:
        """Nothing: :meth:`handle` rewrites the record in place for the handlers after this one."""


def install_pika_lines(level: int) -> None:
    """Set pika's logger to ``level``, but no lower than WARNING (pika is chatty at INFO about every
    connection), and put one :class:`PikaAddresses` on it (called again: no second one)."""
    pika = logging.getLogger(PIKA_LOGGER)
    pika.setLevel(max(level, logging.WARNING))
    if not any(isinstance(handler, PikaAddresses) for handler in pika.handlers):
        pika.addHandler(PikaAddresses())
