"""Keep job arguments out of the records Dramatiq itself logs.

Dramatiq logs ``str(message)`` (the actor call with the ``repr`` of every argument) when a job fails,
is skipped or, at DEBUG, received; an actor's logger prints its arguments at DEBUG; an undecodable
body is logged whole inside the exception's message. Pattern scrubbing cannot recognise a name or
an address passed as a positional argument, so this filter removes the values at the source:
a message becomes ``actor(message_id=...)``, argument dumps become counts and key names, an
undecodable body becomes its length. The consumer's line about a message of no registered actor
names that actor, and so does its exception: that name is the sender's text (an e-mail address,
a person's name), shown as ``unknown``. Attach it to the handlers before the scrubbing filter.
"""

from __future__ import annotations

import logging
from typing import Any

from dramatiq import Message
from dramatiq.broker import MessageProxy
from dramatiq.errors import ActorNotFound, DecodeError

from jobsystem.dramatiq_internals import ACTOR_ARGUMENTS_FORMAT, UNDEFINED_ACTOR_FORMAT
from jobsystem.runtime.actor_names import UNKNOWN_ACTOR, unnamed_actor_not_found


class _Shown:
    """A log argument that formats as fixed text, with ``%s`` and ``%r`` alike."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text

    __str__ = __repr__


def describe_message(message: Message[Any] | MessageProxy) -> _Shown:
    """A message as its actor and id only: ``send_email(message_id=...)``."""
    return _Shown(f"{message.actor_name}(message_id={message.message_id})")


def _hidden_arguments(args: Any, kwargs: Any) -> tuple[_Shown, _Shown]:
    count = len(args) if isinstance(args, (tuple, list)) else "?"
    keys = ", ".join(sorted(map(str, kwargs))) if isinstance(kwargs, dict) else "?"
    return _Shown(f"<{count} hidden>"), _Shown(f"<hidden: {keys}>")


def _safe_decode_error(error: DecodeError) -> DecodeError:
    size = len(error.data) if isinstance(error.data, (bytes, str)) else 0
    text = f"failed to decode message ({size} bytes, body not logged)"
    safe: DecodeError = DecodeError(text, b"", None)  # type: ignore[no-untyped-call]
    safe.__traceback__ = error.__traceback__
    safe.__suppress_context__ = True
    return safe


class HideMessageArguments(logging.Filter):
    """A ``logging`` filter: no job argument or raw body reaches a handler from Dramatiq's records."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            if isinstance(record.args, tuple) and record.args:
                if record.msg == ACTOR_ARGUMENTS_FORMAT and len(record.args) == 2:
                    record.args = _hidden_arguments(*record.args)
                elif record.msg == UNDEFINED_ACTOR_FORMAT:
                    record.args = (_Shown(repr(UNKNOWN_ACTOR)),)
                else:
                    record.args = tuple(
                        describe_message(a) if isinstance(a, (Message, MessageProxy)) else a
                        for a in record.args
                    )
            if record.exc_info and isinstance(record.exc_info[1], DecodeError):
                record.exc_info = (DecodeError, _safe_decode_error(record.exc_info[1]), record.exc_info[2])
                record.exc_text = None
            elif record.msg == UNDEFINED_ACTOR_FORMAT and record.exc_info:
                error = record.exc_info[1]
                if isinstance(error, ActorNotFound):
                    record.exc_info = (ActorNotFound, unnamed_actor_not_found(error), record.exc_info[2])
                    record.exc_text = None
        except Exception:  # when in doubt, drop the record's content, not the record
            record.msg, record.args, record.exc_info, record.exc_text = "[log record hidden]", (), None, None
        return True
