"""An exception and its whole chain as text, for the scrubber to read (its message may hold anything)."""

from __future__ import annotations

__all__ = ["exception_text"]

#: Exceptions rendered per chain, at most (a loop of causes, a huge group).
_MAX_EXCEPTIONS = 32


def exception_text(exc: BaseException) -> str:
    """``Type: message`` of ``exc`` and of its whole chain: cause, context and group members."""
    lines: list[str] = []
    seen: set[int] = set()

    def visit(error: BaseException, how: str, depth: int) -> None:
        if id(error) in seen or len(lines) >= _MAX_EXCEPTIONS:
            return
        seen.add(id(error))
        try:
            message = str(error)
        except Exception:
            message = "<message unavailable>"
        lines.append(f"{'  ' * depth}{how}{type(error).__name__}: {message}")
        if error.__cause__ is not None:
            visit(error.__cause__, "caused by ", depth + 1)
        elif error.__context__ is not None and not error.__suppress_context__:
            visit(error.__context__, "while handling ", depth + 1)
        for member in getattr(error, "exceptions", None) or ():
            if isinstance(member, BaseException):
                visit(member, "member ", depth + 1)

    visit(exc, "", 0)
    return "\n".join(lines)
