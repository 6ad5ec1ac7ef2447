"""Each dead letter RabbitMQ confirmed, filed in the dead-letter index of the state store.

The broker publishes a dead letter with its record as ``x-dl-*`` headers and, once RabbitMQ
confirmed it, hands the same headers here: the entry is written by a background thread, in
batches (:class:`~jobsystem.runtime.deferred.DeferredWrites`), so the consumer never waits for the
store, and a store that does not answer delays the entry, never the dead letter. An entry the index
misses is found again by a re-index (:func:`jobsystem.ops.dead_letters.reindex`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from dramatiq import Message

from jobsystem.runtime.actor_names import actor_label
from jobsystem.runtime.deferred import DeferredWrites, best_effort
from jobsystem.runtime.message_shape import decode, int_option
from jobsystem.store.base import StateStore
from jobsystem.store.dead_letter_index import DeadLetterEntry, IndexBackend, dead_letter_index
from middleware import dead_letters as record

__all__ = ["DeadLetterIndexer", "entry_from_headers", "replays_of"]

logger = logging.getLogger(__name__)


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return "" if value is None else str(value)


def _millis(value: Any) -> int | None:
    try:
        return int(datetime.fromisoformat(_text(value)).timestamp() * 1000) if value else None
    except ValueError:
        return None


def replays_of(body: bytes) -> int | None:
    """How many times the job in a dead letter's ``body`` had been replayed from the dead letters
    (its option ``replays``; 0 when not set), None for a body that is not a message."""
    message = decode(body, None)
    return int_option(message.options, record.REPLAYS) if isinstance(message, Message) else None


def entry_from_headers(
    queue: str, message_id: str, headers: Mapping[str, Any], replays: int | None = None
) -> DeadLetterEntry:
    """The index entry of a dead letter published with ``headers`` (its ``x-dl-*`` record) whose
    job had been replayed ``replays`` times (:func:`replays_of` its body)."""
    attempts = headers.get(record.HEADER_ATTEMPTS)
    return DeadLetterEntry(
        queue=queue,
        message_id=message_id,
        actor=actor_label(_text(headers.get(record.HEADER_ACTOR))),
        reason=_text(headers.get(record.HEADER_REASON)) or "rejected",
        exception=_text(headers.get(record.HEADER_EXCEPTION)),
        error=_text(headers.get(record.HEADER_ERROR))[:1_000],
        traceback=_text(headers.get(record.HEADER_TRACEBACK))[-4_000:],
        attempts=attempts if isinstance(attempts, int) and not isinstance(attempts, bool) else 0,
        enqueued_at=_millis(headers.get(record.HEADER_ENQUEUED_AT)),
        failed_at=_millis(headers.get(record.HEADER_FAILED_AT)) or 0,
        replays=replays,
    )


class DeadLetterIndexer:
    """Files confirmed dead letters in the index, in the background.

    Parameters:
      store: the shared state store.
      ttl_ms, max_length: the dead-letter queues' bounds (``DEAD_LETTER_TTL_MS``,
        ``DEAD_LETTER_MAX_LENGTH``), applied to the index too.
    """

    def __init__(
        self, store: StateStore, *, ttl_ms: int | None = None, max_length: int | None = None
    ) -> None:
        self.backend: IndexBackend = dead_letter_index(store)
        self.ttl_ms = ttl_ms
        self.max_length = max_length
        self.writes = DeferredWrites(store)

    def record(self, queue: str, message_id: str, headers: Mapping[str, Any], body: bytes = b"") -> None:
        """Index a dead letter RabbitMQ confirmed (``body``: what it holds, for its replays). Never
        raises: the dead letter is safe already, and a raise in the publish path would publish it
        again."""
        try:
            entry = entry_from_headers(queue, message_id, headers, replays_of(body))
            self.writes.submit(self._add_many, entry)
        except Exception:
            logger.exception("dead_letter_index_failed", extra={"message_id": message_id})

    @best_effort  # an index entry: a misconfigured store may drop it
    def _add_many(self, view: StateStore, entries: list[DeadLetterEntry]) -> None:
        self.backend.add(entries, ttl_ms=self.ttl_ms, max_length=self.max_length)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every entry recorded so far is written; False on timeout."""
        return self.writes.flush(timeout)
