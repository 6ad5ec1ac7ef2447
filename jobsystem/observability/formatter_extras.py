"""Extras of a standard-library record that are another formatter's copy of its message, not fields.

uvicorn passes every record of its own a ``color_message``: its message with ANSI colour codes
and a ``%d`` template left in, for uvicorn's own formatter. ``jobctl dashboard`` does not use that
formatter (``log_config=None``) but the project's, whose ``ExtraAdder`` copies every extra into the
event: each start-up line would carry the escape codes, on a terminal and in JSON logs alike.
:func:`drop_formatter_extras` runs right after ``ExtraAdder``, for every logger.
"""

from __future__ import annotations

from typing import Any

from structlog.typing import EventDict

__all__ = ["FORMATTER_EXTRAS", "drop_formatter_extras"]

#: The extras dropped: uvicorn's coloured twin of its message.
FORMATTER_EXTRAS = frozenset({"color_message"})


def drop_formatter_extras(_logger: Any, _method: str, event: EventDict) -> EventDict:
    """``event`` without :data:`FORMATTER_EXTRAS` (a structlog processor)."""
    for name in FORMATTER_EXTRAS.intersection(event):
        del event[name]
    return event
