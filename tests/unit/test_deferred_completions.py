"""An idempotency completion the store refuses for a moment is written once it takes it.

A completion is what makes a key's job exactly-once: once it is written, a redelivered copy of the
message (its ack lost with a connection) is skipped as ``completed``. Dropped, the key stays
pending, its lease lapses, and the next copy of the message runs the job a second time. A refusal
of the configuration may pass: ``NOAUTH`` from a proxy (TLS, cluster, a cloud endpoint) whose Redis
behind it restarted with ``requirepass`` (the completion script runs on the thread's own
connection, outside redis-py's retry; the store drops that connection and the next try, on a new
connection that authenticates, is taken), ``WRONGPASS``/``NOPERM`` while a password or an ACL is
rolled out to the servers before the workers' secret. Review 4 of ``fix/leftovers`` found such a
completion dropped at its first refusal; it is kept and retried (see ``test_deferred_misconfigured``).
"""

from __future__ import annotations

import threading

from redis._parsers.base import BaseParser

from jobsystem.runtime.deferred import DeferredWrites
from jobsystem.store.base import StateStore
from jobsystem.store.idempotency import ClaimRequest, idempotency_backend
from jobsystem.store.redis import redis_error
from middleware.idempotency import _complete_many

KEY, MESSAGE, TTL_MS, LEASE_MS = "review4-order-1", "m-1", 60_000, 30_000


class RefusedForAMoment:
    """``_complete_many`` on a store that refuses the client (``NOAUTH``, a proxy's restarted Redis)
    twice, then takes it."""

    __qualname__ = _complete_many.__qualname__  # the kind, as the drop logs it

    def __init__(self) -> None:
        self.refused = threading.Event()
        self.refusals = 2
        self.error = redis_error(BaseParser.parse_error("NOAUTH Authentication required."))  # type: ignore[no-untyped-call]

    def __call__(self, view: StateStore, items: list[tuple[str, str | None, int]]) -> None:
        if self.refusals:
            self.refusals -= 1
            self.refused.set()
            raise self.error
        _complete_many(view, items)


def test_a_completion_the_store_takes_is_written(store: StateStore) -> None:
    """The control: the same completion, not refused, makes a later copy ``completed``."""
    backend = idempotency_backend(store)
    backend.register(KEY, MESSAGE, TTL_MS)
    assert backend.claim(KEY, MESSAGE, "worker-a", LEASE_MS, TTL_MS).status == "claimed"
    writes = DeferredWrites(store, retry_delay=0.01)
    try:
        writes.submit(_complete_many, (KEY, "null", TTL_MS))
        assert writes.flush(5)
    finally:
        writes.stop(timeout=0)
    assert backend.claim(KEY, MESSAGE, "worker-b", LEASE_MS, TTL_MS).status == "completed"


def test_a_completion_refused_for_a_moment_is_written_once_the_store_takes_it(store: StateStore) -> None:
    backend = idempotency_backend(store)
    backend.register(KEY, MESSAGE, TTL_MS)
    assert backend.claim(KEY, MESSAGE, "worker-a", LEASE_MS, TTL_MS).status == "claimed"
    refused = RefusedForAMoment()
    writes = DeferredWrites(store, retry_delay=0.01)
    try:
        writes.submit(refused, (KEY, "null", TTL_MS))
        assert refused.refused.wait(5)
        assert writes.flush(5)
    finally:
        writes.stop(timeout=0)
    # A redelivered copy is skipped as completed (dropped, it was "held", then "claimed" once the
    # lease of worker-a lapsed, and the job ran again).
    copy = ClaimRequest(KEY, MESSAGE, "worker-b", LEASE_MS, TTL_MS)
    assert backend.claim_many([copy])[0].status == "completed"
