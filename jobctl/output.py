"""Everything ``jobctl`` prints goes through the project's scrubber.

A command prints what it reads from RabbitMQ, the state store and the management API, and the
errors they raise (a ``requests`` error names the URL it called, credentials included). Rather
than trusting every ``echo`` to redact what it prints, :func:`protect_output` puts a scrubbing
stream in front of ``sys.stdout`` and ``sys.stderr`` as soon as the project is loaded: URLs lose
their passwords, configured secrets and personal data are replaced, whatever the command prints.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Callable
from typing import TextIO

__all__ = ["ScrubbedStream", "protect_output"]


class ScrubbedStream(io.TextIOBase):
    """A text stream that writes ``scrub(text)`` to ``stream``.

    Parameters:
      stream: the stream written to (the process's stdout or stderr).
      scrub: the text scrubber.
    """

    def __init__(self, stream: TextIO, scrub: Callable[[str], str]) -> None:
        super().__init__()
        self.stream = stream
        self.scrub = scrub

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.stream.encoding

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return self.stream.errors

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not isinstance(text, str):  # click probes for a binary stream with write(b"")
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        # Line by line: the scrubber cuts a text past its length limit, and a cut through a
        # newline would join two lines (two JSON records of `jobctl dlq export`) into one.
        self.stream.write("\n".join(map(self.scrub, text.split("\n"))))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()


def protect_output(scrub: Callable[[str], str]) -> None:
    """Put :class:`ScrubbedStream` in front of ``sys.stdout`` and ``sys.stderr`` (once)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, ScrubbedStream):
            setattr(sys, name, ScrubbedStream(stream, scrub))
