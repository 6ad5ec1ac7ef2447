"""What a message's idempotency key is, and the name it has in the store and the logs.

A key comes from the message option ``idempotency_key`` or from its actor's ``idempotency_key``
callable. Keys are job data (``ana@example.com|welcome``), so a key names nothing until it is
scoped by actor and hashed: ``actor:<keyed hash of actor:key>``, the same at send, at run and in
lookups. A key is hashed as its Unicode NFC form: ``café`` typed on macOS (decomposed, NFD) and on
Linux (composed) is one key, not two. An ASCII key is its own NFC form, so it hashes as it always has.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dramatiq
from dramatiq import Message
from dramatiq.broker import Broker, MessageProxy
from dramatiq.middleware import MiddlewareError, SkipMessage

from jobsystem.runtime.options import option_of, wait_ms

__all__ = ["CompletedDuplicate", "IdempotencyKeyError", "key_kept_through_wait", "message_key", "scoped_key"]


class IdempotencyKeyError(MiddlewareError):
    """The actor's ``idempotency_key`` function raised or gave something that is not a key."""


class CompletedDuplicate(SkipMessage):
    """A message skipped because an earlier run completed its key: its effect happened. Hooks
    that count ends (a workflow's members) count it as succeeded, with ``result``, the JSON the
    completing run recorded (None when it recorded none)."""

    def __init__(self, result: str | None) -> None:
        super().__init__("duplicate of a completed message")
        self.result = result


def scoped_key(hasher: Callable[[str], str], actor_name: str, key: str) -> str:
    """The name ``key`` of ``actor_name`` has in the store and the logs: the same for every
    Unicode form of one key (the project's hasher, ``KeyHasher``, hashes NFC forms)."""
    return f"{actor_name}:{hasher(f'{actor_name}:{key}')}"


def message_key(
    broker: Broker, message: Message[Any] | MessageProxy, hasher: Callable[[str], str]
) -> str | None:
    """The message's scoped, hashed key (:func:`scoped_key`), from its option or its actor's
    callable; None when it has none. The key as given is kept in the option ``idempotency_key``.

    Raises :class:`IdempotencyKeyError` when the callable raises or the key is not a string or
    number: such a message can be neither checked nor safely run.
    """
    # Each attribute of a MessageProxy is a __getattr__ call: read those needed once.
    options, actor_name = message.options, message.actor_name
    key = options.get("idempotency_key")
    if key is None:
        try:
            actor = broker.get_actor(actor_name)
        except dramatiq.errors.ActorNotFound:
            return None
        make_key: Callable[..., Any] | None = actor.options.get("idempotency_key")
        if make_key is None:
            return None
        try:
            key = make_key(*message.args, **message.kwargs)
        except Exception as exc:
            raise IdempotencyKeyError(
                f"actor {actor_name!r}: idempotency_key raised {type(exc).__name__}: {exc}"
            ) from exc
        if key is None:
            return None
    if isinstance(key, bool) or not isinstance(key, str | int | float) or key == "":
        raise IdempotencyKeyError(
            f"actor {actor_name!r}: idempotency_key gave {type(key).__name__}, not a key"
        )
    options["idempotency_key"] = text = str(key)
    return scoped_key(hasher, actor_name, text)


def key_kept_through_wait(
    broker: Broker, message: Message[Any], hasher: Callable[[str], str], default_ttl_ms: int
) -> tuple[str, int] | None:
    """``(key, ttl_ms)`` to keep the key of ``message``, re-enqueued to wait (a retry's backoff, a
    deferral for a slot), for as long as the wait and its TTL after; None when its TTL (from its
    last claim) still covers twice the wait, or it has no valid key (it is dead-lettered when it
    runs). A key that expired during the wait would let a duplicate sent in the gap run, and then
    this message too once that one's completed key expired."""
    wait = wait_ms(message)
    ttl = int(option_of(broker, message, "idempotency_ttl", default_ttl_ms))
    if wait * 2 <= ttl:
        return None
    try:
        key = message_key(broker, message, hasher)
    except IdempotencyKeyError:
        return None
    return None if key is None else (key, ttl + wait)
