"""Idempotency keys: a duplicate send is dropped, and a key's effect happens at most once at run.

Before the actor runs, the worker claims the message's key with a lease: a completed key skips the
message, a key held by another worker defers it, an unreachable store defers it (fail closed).
Keys are stored and logged only as ``actor:<keyed hash>``. The whole design, claims made at
receipt included, is in ``docs/architecture.md`` ("Idempotency keys").
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import dramatiq
from dramatiq import Message
from dramatiq.broker import Broker, MessageProxy
from dramatiq.middleware import MiddlewareError, SkipMessage

from jobsystem.dramatiq_internals import reject
from jobsystem.privacy.keyhash import KeyHasher
from jobsystem.privacy.outage_lines import log_outage
from jobsystem.runtime.claims_ahead import ClaimsAhead
from jobsystem.runtime.coalesce import Coalescer
from jobsystem.runtime.deferred import DeferredWrites
from jobsystem.runtime.idempotency_keys import (
    CompletedDuplicate,
    IdempotencyKeyError,
    key_kept_through_wait,
    message_key,
    scoped_key,
)
from jobsystem.runtime.leases import HeldLeases, new_owner
from jobsystem.runtime.options import key_ttl_ms, option_of
from jobsystem.runtime.requeue import backoff_ms, option_count, postpone
from jobsystem.runtime.result_json import result_json
from jobsystem.runtime.unpublished_keys import UnpublishedKeys
from jobsystem.store.base import StateStore, StoreUnavailable
from jobsystem.store.idempotency import Claim, ClaimRequest, KeyRecord, idempotency_backend
from middleware.guard import FailClosed

__all__ = [
    "HELD_WAITS",
    "REGISTERED",
    "DuplicateMessage",
    "Idempotency",
    "IdempotencyKeyError",
    "IdempotencyStoreError",
    "as_duplicate",
]

logger = logging.getLogger(__name__)

#: A message as sent, or as the worker hands it to middleware.
AnyMessage = Message[Any] | MessageProxy

#: Message option set once a message's key is registered, so that re-enqueues of the same message
#: (retries, delayed moves, deferrals) are not taken for duplicate sends.
REGISTERED = "idempotency_registered"
#: Message option counting how often a message found its key held by another worker in a row.
HELD_WAITS = "idempotency_held_waits"
_UNKEYED = "no STATE_KEY_SECRET set, so idempotency keys are hashed under a public key"


class DuplicateMessage(MiddlewareError):
    """A send whose key is already pending or completed; ``original_message_id`` is the first."""

    def __init__(self, key: str, original_message_id: str) -> None:
        super().__init__(f"duplicate of message {original_message_id}")
        self.key = key
        self.original_message_id = original_message_id


def as_duplicate(message: Message[Any], original_message_id: str) -> Message[Any]:
    """What a dropped duplicate send returns: the message with the original's id and ``duplicate=True``."""
    return message.copy(message_id=original_message_id, options={"duplicate": True})


class IdempotencyStoreError(MiddlewareError):
    """The state store could not be asked at send: the caller sees it and nothing is published."""


@dataclass
class _Held:
    key: str
    owner: str
    #: How long the key is remembered once completed (the actor's ``idempotency_ttl``).
    ttl_ms: int
    #: Under which the lease is renewed while the job runs (None: not renewed).
    token: int | None = None


class Idempotency(FailClosed):
    """Dedup at send and a leased claim at run, on a :class:`~jobsystem.store.base.StateStore`.

    Parameters:
      store: the shared state store.
      ttl_ms: how long a key is remembered after its send or completion (actor option
        ``idempotency_ttl``); 24 hours by default.
      lease_ms: the run claim's lease; renewed every third of it while the job runs.
      drop_duplicates: whether a duplicate send is dropped (actor option
        ``idempotency_drop_duplicates``); when False it is published and the run guard skips it.
      store_retry_ms: the delay before a message is checked again while the store is down or a
        check fails unexpectedly (doubling per consecutive deferral, up to ``max_store_retry_ms``).
      result_max_bytes: results larger than this, once JSON-encoded, are not stored.
      key_hasher: hashes each scoped key before it becomes a store key or a log field (every
        process sharing the store needs the same secret); without one, keys are hashed unkeyed.
      writes: the background writer completions and releases go through; share one with
        :class:`~middleware.status.Status` so a job's completion and its outcome leave together.
    """

    def __init__(
        self,
        store: StateStore,
        *,
        ttl_ms: int = 86_400_000,
        lease_ms: int = 30_000,
        drop_duplicates: bool = True,
        store_retry_ms: int = 2_000,
        max_store_retry_ms: int = 60_000,
        result_max_bytes: int = 65_536,
        key_hasher: KeyHasher | None = None,
        writes: DeferredWrites | None = None,
    ) -> None:
        self.store = store
        self.hasher = key_hasher or KeyHasher()
        self.backend = idempotency_backend(store)
        self.ttl_ms = ttl_ms
        self.lease_ms = lease_ms
        self.drop_duplicates = drop_duplicates
        self.defer_base_ms = store_retry_ms
        self.defer_max_ms = max_store_retry_ms
        self.result_max_bytes = result_max_bytes
        self.writes = writes or DeferredWrites(store)
        # Claims of concurrent worker threads share round trips (see jobsystem.runtime.coalesce).
        self.claims: Coalescer[ClaimRequest, Claim] = Coalescer(self._claim_many)
        self._local = threading.local()
        self.leases = HeldLeases(self.backend.renew, lease_ms)
        self.ahead = ClaimsAhead(self.backend, lease_ms, pause_after_failure_s=2 * store.timeout)
        self.unpublished = UnpublishedKeys(self.backend, REGISTERED)

    send_error = IdempotencyStoreError
    defer_option = "idempotency_store_waits"

    @property
    def actor_options(self) -> set[str]:
        return {"idempotency_key", "idempotency_ttl", "idempotency_drop_duplicates"}

    # -- keys ------------------------------------------------------------------------------------

    def scoped(self, actor_name: str, key: str) -> str:
        """The name a key has in the store and the logs: ``actor:<hash of actor:key>``."""
        return scoped_key(self.hasher, actor_name, key)

    def key_of(self, broker: Broker, message: AnyMessage) -> str | None:
        """The message's scoped, hashed key, or None (see :func:`message_key`, which may raise
        :class:`IdempotencyKeyError`)."""
        return message_key(broker, message, self.hasher)

    def lookup(self, actor_name: str, key: str) -> KeyRecord | None:
        """What the store knows of ``key`` for ``actor_name`` (state, first message id, result)."""
        return self.backend.lookup(self.scoped(actor_name, str(key)))

    # -- send ------------------------------------------------------------------------------------

    def before_enqueue(self, broker: Broker, message: Message[Any], delay: int | None) -> None:
        duplicates, registered = self._register(broker, [message])
        if message.message_id in duplicates:
            raise DuplicateMessage(
                str(message.options.get("idempotency_key")), duplicates[message.message_id]
            )
        if registered:
            self.unpublished.hold(registered)  # until published: see on_unsent

    def after_enqueue(self, broker: Broker, message: Message[Any], delay: int | None) -> None:
        self.unpublished.published(message.message_id)

    def on_unsent(self, broker: Broker, message: Message[Any]) -> None:
        """The project's broker could not publish ``message``: forget the key this thread
        registered for it, so that a new send of the key is published, not dropped as a duplicate
        of a message RabbitMQ never had (had it gone through, the claim at run lets one run)."""
        self.unpublished.give_back([message])

    def before_enqueue_batch(self, broker: Broker, messages: Iterable[Message[Any]]) -> dict[str, str]:
        """Register the keys of many messages in one store operation (bulk send uses it).

        Returns ``{message_id: original_message_id}`` for the duplicates, which are not to be
        published. The others are marked registered (a retry or delayed move of the message is not
        a duplicate); their keys are held until published or given back (``on_unsent_batch``)."""
        duplicates, registered = self._register(broker, messages)
        self.unpublished.hold(registered)
        return duplicates

    def on_unsent_batch(self, broker: Broker, messages: Iterable[Message[Any]]) -> None:
        """A bulk send did not publish ``messages``: forget, in one store call, the keys this
        thread's last batch registered for them (as :meth:`on_unsent` does for one send)."""
        self.unpublished.give_back(messages)

    def _register(
        self, broker: Broker, messages: Iterable[Message[Any]]
    ) -> tuple[dict[str, str], list[tuple[str, str]]]:
        """The duplicates (``{message_id: original_message_id}``), and ``(key, message_id)`` of
        the messages whose keys are registered to them now (by this call or an earlier send)."""
        to_register: list[tuple[Message[Any], str, int]] = []
        to_keep: list[tuple[str, int]] = []  # re-enqueued to wait longer than their keys live
        for message in messages:
            if message.options.get(REGISTERED):
                to_keep += filter(None, [key_kept_through_wait(broker, message, self.hasher, self.ttl_ms)])
                continue
            key = self.key_of(broker, message)
            if key is None:
                continue
            if option_of(broker, message, "idempotency_drop_duplicates", self.drop_duplicates):
                to_register.append((message, key, key_ttl_ms(broker, message, self.ttl_ms)))
            else:
                message.options[REGISTERED] = True
        if not to_register and not to_keep:
            return {}, []
        items = [(key, m.message_id, ttl) for m, key, ttl in to_register]
        try:
            if to_keep:
                self.backend.keep_many(to_keep)
            originals = self.backend.register_many(items) if items else []
        except StoreUnavailable as exc:
            raise IdempotencyStoreError(str(exc)) from exc
        duplicates: dict[str, str] = {}
        registered: list[tuple[str, str]] = []
        for (message, key, _), original in zip(to_register, originals, strict=True):
            if original is not None and original != message.message_id:
                logger.info("duplicate_dropped", extra={"key": key, "original_message_id": original})
                duplicates[message.message_id] = original
            else:
                message.options[REGISTERED] = True  # new, or this message's own (sent again)
                registered.append((key, message.message_id))
        return duplicates, registered

    # -- run -------------------------------------------------------------------------------------

    def on_receive(self, broker: Broker, messages: list[MessageProxy]) -> None:
        """Called by the project's consumer with each burst of deliveries before any is handed out:
        claims their keys in one store call, so ``before_process_message`` finds each answer."""
        claims = [(m, request) for m in messages if (request := self._request_ahead(broker, m)) is not None]
        if claims:
            self.ahead.send(claims)

    def _request_ahead(self, broker: Broker, message: MessageProxy) -> ClaimRequest | None:
        """The claim to make ahead for a delivery; None for a delayed message (re-enqueued, not run,
        when due), an unknown actor's (dead-lettered), no key, or an invalid one (dead-lettered at
        start). A received message is past its send: its re-enqueues (retries, deferrals, delayed
        moves) are never duplicate sends, and must not need the store to be published."""
        options = message.options
        options[REGISTERED] = True
        if "eta" in options or message.actor_name not in broker.actors:
            return None
        with contextlib.suppress(IdempotencyKeyError):
            key = self.key_of(broker, message)
            if key is not None:
                ttl = option_of(broker, message, "idempotency_ttl", self.ttl_ms)
                return ClaimRequest(key, message.message_id, new_owner(), self.lease_ms, ttl)
        return None

    def on_dropped(self, broker: Broker, message: MessageProxy) -> None:
        """A delivery claimed ahead was dropped before it reached the worker threads (its consumer
        closed first; RabbitMQ redelivers it): its claim, if granted, is given back through the
        writer, so the copy redelivered does not wait out the lease."""
        request = self.ahead.dropped(message)
        if request is not None:
            logger.info("claim_given_back", extra={"message_id": message.message_id})
            self.writes.submit(_release_many, (request.key, request.owner))

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        self._local.held = None
        message.options[REGISTERED] = True
        ahead = self.ahead.take(message)
        if ahead is not None:  # its key was found at receipt, from the same options and arguments
            key, ttl = ahead.request.key, ahead.request.ttl_ms
        else:
            run_key = self._run_key(broker, message)
            if run_key is None:
                return
            key, ttl = run_key, option_of(broker, message, "idempotency_ttl", self.ttl_ms)
        ahead_owner, claim = self.ahead.answer(ahead)
        owner = ahead_owner or new_owner()
        if claim is None:
            try:
                claim = self.claims.call(ClaimRequest(key, message.message_id, owner, self.lease_ms, ttl))
            except StoreUnavailable as exc:
                log_outage(logger, logging.WARNING, "idempotency_store_unavailable", exc, key=key)
                self._local.held = _Held(key, owner, ttl)  # a claim granted ahead: given back on skip
                self.defer(broker, message, reason="store_unavailable")
        if claim.status == "completed":
            logger.info("duplicate_skipped", extra={"key": key, "original_message_id": claim.message_id})
            raise CompletedDuplicate(claim.result or None)
        if claim.status == "held":
            # Ask again soon, then less and less often, never later than the holder's lease
            # lapses: the holder usually finishes long before its lease would.
            waits = option_count(message.options.get(HELD_WAITS))
            delay = min(claim.wait_ms, backoff_ms(waits, 500, self.lease_ms)) + random.randint(50, 250)
            logger.info("duplicate_deferred", extra={"key": key, "delay_ms": delay})
            postpone(broker, message, delay, reason="idempotency_key_held", options={HELD_WAITS: waits + 1})
            raise SkipMessage("key held by another worker: deferred")
        self._local.held = _Held(key, owner, ttl, self.leases.hold(key, owner))

    def _run_key(self, broker: Broker, message: MessageProxy) -> str | None:
        """The message's key at start; an invalid one dead-letters the message (SkipMessage)."""
        try:
            return self.key_of(broker, message)
        except IdempotencyKeyError as exc:
            # The key cannot be known, so neither can the guard: dead-letter it with the error.
            logger.error(
                "idempotency_key_invalid", extra={"message_id": message.message_id, "error": str(exc)}
            )
            reject(message, "rejected", error=exc)
            raise SkipMessage("idempotency key invalid") from None

    def _claim_many(self, requests: list[ClaimRequest]) -> list[Claim]:
        try:
            claims = self.backend.claim_many(requests)
        except StoreUnavailable:
            self.ahead.store_failed_at = time.monotonic()
            raise
        self.ahead.store_answered_at = time.monotonic()
        return claims

    def _finish(self) -> _Held | None:
        held: _Held | None = getattr(self._local, "held", None)
        self._local.held = None
        if held is not None and held.token is not None:
            self.leases.release(held.token)
        return held

    def after_process_message(
        self,
        broker: Broker,
        message: MessageProxy,
        *,
        result: Any | None = None,
        exception: BaseException | None = None,
    ) -> None:
        held = self._finish()
        if held is None:
            return
        if exception is not None:
            self.writes.submit(_release_many, (held.key, held.owner))
            return
        self.writes.submit(_complete_many, (held.key, self._encode_result(result), held.ttl_ms))

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        # The message was skipped after the claim (e.g. the actor raised RateLimited) and is
        # re-enqueued by whoever skipped it: release now, not in the background, so the copy can
        # never come back to find the claim still held (which would delay it by a whole lease).
        held = self._finish()
        ahead = self.ahead.take(message)
        if held is None and ahead is not None and self.ahead.granted(ahead):
            # Skipped before its turn came (age limit, rate limit): give back the claim made at receipt.
            held = _Held(ahead.request.key, ahead.request.owner, ahead.request.ttl_ms)
        if held is not None:
            try:
                self.backend.release_many([(held.key, held.owner)])
            except StoreUnavailable:
                self.writes.submit(_release_many, (held.key, held.owner))

    def _encode_result(self, result: Any) -> str | None:
        return "null" if result is None else result_json(result, self.result_max_bytes)  # most: None

    def before_consumer_thread_shutdown(self, broker: Broker, thread: Any) -> None:
        """Give back the claims made ahead for messages that will not start here (RabbitMQ redelivers
        them once Dramatiq closes the consumers, and they would wait out this worker's leases).
        Claims are made on each consumer's thread, which runs this hook after its last one."""
        unstarted = self.ahead.unstarted()
        if not unstarted:
            return
        try:
            self.backend.release_many([(r.key, r.owner) for r in unstarted])
            logger.info("claims_released", extra={"claims": len(unstarted)})
        except StoreUnavailable as exc:
            log_outage(logger, logging.WARNING, "claims_release_failed", exc, claims=len(unstarted))

    def after_worker_boot(self, broker: Broker, worker: dramatiq.Worker) -> None:
        if not self.hasher.keyed:
            logger.warning("state_keys_unkeyed", extra={"detail": _UNKEYED})

    def after_worker_shutdown(self, broker: Broker, worker: dramatiq.Worker) -> None:
        # Not before: Dramatiq lets the running jobs finish first (up to its shutdown timeout),
        # and a job whose lease lapsed meanwhile could run a second time beside a copy.
        self.leases.stop()
        self.writes.stop()


def _complete_many(view: StateStore, items: list[tuple[str, str | None, int]]) -> None:
    idempotency_backend(view).complete_many(items)


def _release_many(view: StateStore, claims: list[tuple[str, str]]) -> None:
    idempotency_backend(view).release_many(claims)
