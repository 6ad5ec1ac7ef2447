"""Dramatiq's own records keep their sense but lose the job's arguments and raw bodies."""

from __future__ import annotations

import logging
import sys
from types import TracebackType
from typing import Any

from dramatiq import Message
from dramatiq.broker import MessageProxy
from dramatiq.errors import DecodeError

from jobsystem.dramatiq_internals import ACTOR_ARGUMENTS_FORMAT
from jobsystem.privacy.message_logs import HideMessageArguments
from tests.pii_corpus import free_text, leaks

#: What ``sys.exc_info()`` returns, as a record keeps it.
ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]


def _record(msg: object, *args: object, exc_info: ExcInfo | None = None) -> logging.LogRecord:
    return logging.LogRecord("dramatiq.worker", logging.ERROR, __file__, 1, msg, args or None, exc_info)


def test_dramatiq_records_show_messages_without_their_arguments():
    message: Message[Any] = Message(
        queue_name="q", actor_name="send_email", args=("Ana Lucia Lopez",), kwargs={"to": "x"}, options={}
    )
    hide = HideMessageArguments()
    for argument in (message, MessageProxy(message)):
        record = _record("Failed to process message %s with unhandled exception.", argument)
        hide.filter(record)
        assert record.getMessage() == (
            f"Failed to process message send_email(message_id={message.message_id}) with unhandled exception."
        )
    record = _record(ACTOR_ARGUMENTS_FORMAT, ("Ana Lucia Lopez", 3), {"to": "ana.lopez@example.com"})
    hide.filter(record)
    assert record.getMessage() == "Received args=<2 hidden> kwargs=<hidden: to>."


def test_undecodable_body_is_reduced_to_its_size():
    body = b"\xff" + free_text().encode()
    try:
        Message.decode(body)
    except DecodeError:
        record = _record("Failed to decode message using encoder %r.", "json", exc_info=sys.exc_info())
    HideMessageArguments().filter(record)
    assert record.exc_info is not None
    assert str(record.exc_info[1]) == f"failed to decode message ({len(body)} bytes, body not logged)"
    text = logging.Formatter().format(record)
    assert f"failed to decode message ({len(body)} bytes, body not logged)" in text
    assert leaks(text) == []


def test_other_records_pass_unchanged():
    record = _record("Retrying message %r in %d milliseconds.", "0b9d3c1e", 213)
    HideMessageArguments().filter(record)
    assert record.getMessage() == "Retrying message '0b9d3c1e' in 213 milliseconds."
