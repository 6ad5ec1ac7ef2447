"""Every message a message carries, so that whatever hides a job's arguments hides them all.

A pipeline's next step travels in Dramatiq's ``pipe_target`` option, a workflow's later steps in the
project's ``workflow`` option (``next``): each a whole message as ``Message.asdict()`` gives it,
arguments included, whose options may carry further steps in turn. Sentry's events (the message in
``contexts.dramatiq``) and ``jobctl dlq show`` hide a job's arguments, which no pattern can vouch
for (a name passed positionally); the later steps' arguments are job arguments just the same.
"""

from __future__ import annotations

from typing import Any

__all__ = ["carried_messages"]


def _is_message(value: dict[Any, Any]) -> bool:
    return isinstance(value.get("actor_name"), str) and ("args" in value or "kwargs" in value)


def carried_messages(data: dict[str, Any]) -> list[dict[str, Any]]:
    """``data`` (a message as a dict) and every message dict found inside it, at any depth.

    The dicts themselves, not copies: a caller replaces their ``args`` and ``kwargs`` in place.
    """
    found: list[dict[str, Any]] = [data]
    seen = {id(data)}
    pending: list[Any] = list(data.values())
    while pending:  # a stack, not recursion: a long pipeline nests two levels per step
        value = pending.pop()
        if not isinstance(value, dict | list | tuple) or id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, dict):
            if _is_message(value):
                found.append(value)
            pending.extend(value.values())
        else:
            pending.extend(value)
    return found
