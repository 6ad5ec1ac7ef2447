"""Follow-up publishes RabbitMQ refused: back off, count, alert, and remember what was decided.

Before a delivery may be acked, what its attempt decided must be published: the retry (to the
delay queue) or the dead letter. RabbitMQ can refuse that publish (a ``max-length`` policy with
``reject-publish``, an alarm, a missing queue). Requeueing the delivery at once loops hot: it is
redelivered within milliseconds, the actor runs again, the publish is refused again, and the
attempt is never counted.

So the consumer holds a delivery whose follow-up was refused and requeues it only after a delay
that grows with each refusal (:meth:`RefusedFollowUps.refused`), and counts the refusals per
message: from the ``alert_after``-th on, each is logged at ERROR (``follow_up_publish_refused``),
which reaches Sentry as an error event. The decided follow-up is remembered by message id, so the
redelivery is not handed to a worker thread again: the consumer publishes the follow-up itself
(:meth:`RefusedFollowUps.decided`). The memory is this process's, shared through the state store
when one is given: a redelivery that another worker process (or host) receives finds the decision
there. The store is asked only for redelivered messages, and best effort: if it does not answer,
the redelivery runs the actor again (once per process at most), as plain at-least-once delivery.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from dramatiq import Message

from jobsystem.store.base import StateStore

__all__ = ["DeadLetterFollowUp", "FollowUp", "RefusedFollowUps", "RetryFollowUp"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetryFollowUp:
    """The retry an attempt decided: ``message`` (retries counted) due in ``delay_ms``."""

    message: Message[Any]
    delay_ms: int
    kind: Literal["retry"] = "retry"


@dataclass(frozen=True)
class DeadLetterFollowUp:
    """The dead letter an attempt decided: its ``body`` and ``headers`` (the final record), for
    ``message`` (whose ``on_dead_letter`` hook is told once it is safe)."""

    body: bytes = field(repr=False)
    headers: dict[str, Any]
    message: Message[Any]
    kind: Literal["dead_letter"] = "dead_letter"


FollowUp = RetryFollowUp | DeadLetterFollowUp


@dataclass
class _Refusals:
    follow_up: FollowUp | None
    count: int
    last: float


class RefusedFollowUps:
    """This process's refused follow-ups, by message id: how often, and what was decided.

    Parameters:
      first_delay_s: how long a delivery is held after its first refusal; doubled each time.
      max_delay_s: the longest hold (well below RabbitMQ's ``consumer_timeout``, at least 1 min).
      alert_after: the refusal from which each one is logged at ERROR (the alert).
      forget_after_s: a message not refused again for this long is forgotten (its redelivery may
        have gone to another process, which published the follow-up).
      max_entries: at most this many messages remembered (the oldest are forgotten first).
      clock: monotonic seconds.
      store: the shared state store, so that every worker process knows what was decided; None
        keeps the memory in this process only.
    """

    def __init__(
        self,
        *,
        first_delay_s: float = 1.0,
        max_delay_s: float = 30.0,
        alert_after: int = 3,
        forget_after_s: float = 3600.0,
        max_entries: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
        store: StateStore | None = None,
    ) -> None:
        self.first_delay_s = first_delay_s
        self.max_delay_s = max_delay_s
        self.alert_after = alert_after
        self.forget_after_s = forget_after_s
        self.max_entries = max_entries
        self.clock = clock
        self.store = store
        self._entries: OrderedDict[str, _Refusals] = OrderedDict()
        self._lock = threading.Lock()

    def refused(
        self, key: str, *, kind: str, queue: str, follow_up: FollowUp | None, error: BaseException | None
    ) -> float:
        """Count a refused follow-up of message ``key`` (remembering ``follow_up``, the publish to
        try again), log it, and return how many seconds to hold the delivery before requeueing it."""
        now = self.clock()
        shared = self._shared(key)  # another process may have counted refusals since
        with self._lock:
            self._forget_old(now)
            entry = self._entries.pop(key, None) or _Refusals(follow_up, 0, now)
            entry.count = max(entry.count, shared.count if shared is not None else 0) + 1
            entry.last = now
            entry.follow_up = follow_up or entry.follow_up
            self._entries[key] = entry
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
            count = entry.count
            decided = entry.follow_up
        self._share(key, decided, count)
        delay = float(min(self.first_delay_s * 2 ** min(count - 1, 30), self.max_delay_s))
        logger.log(
            logging.ERROR if count >= self.alert_after else logging.WARNING,
            "follow_up_publish_refused",
            extra={
                "kind": kind,
                "message_id": key,
                "queue": queue,
                "refusals": count,
                "delay_ms": round(delay * 1000),
                "error_type": type(error).__name__ if error is not None else None,
            },
        )
        return delay

    def decided(self, key: str) -> FollowUp | None:
        """The follow-up remembered for message ``key``, if one was refused here or, per the
        state store, in another process."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                return entry.follow_up
        entry = self._shared(key)
        if entry is None:
            return None
        with self._lock:
            self._entries[key] = self._entries.get(key) or entry
            return self._entries[key].follow_up

    def refusals(self, key: str) -> int:
        with self._lock:
            entry = self._entries.get(key)
            return entry.count if entry is not None else 0

    def published(self, key: str, *, kind: str, queue: str) -> None:
        """The follow-up of ``key`` was published at last: forget it, and say so."""
        with self._lock:
            entry = self._entries.pop(key, None)
        if entry is None:
            return
        shared = self._shared(key)  # the count other processes reached, when they took part
        self._unshare(key)
        refusals = max(entry.count, shared.count if shared is not None else 0)
        logger.info(
            "follow_up_published",
            extra={"kind": kind, "message_id": key, "queue": queue, "refusals": refusals},
        )

    def _forget_old(self, now: float) -> None:
        while self._entries:
            key, oldest = next(iter(self._entries.items()))
            if now - oldest.last < self.forget_after_s:
                return
            del self._entries[key]

    # -- the state store's copy ------------------------------------------------------------------

    def _share(self, key: str, follow_up: FollowUp | None, count: int) -> None:
        if self.store is None or follow_up is None:
            return
        try:
            record = json.dumps({"count": count, **_encode(follow_up)}, default=str)
            self.store.set(_STORE_KEY + key, record, ttl_ms=int(self.forget_after_s * 1000))
        except Exception as exc:  # best effort: this process still remembers it
            logger.warning("follow_up_not_shared", extra={"message_id": key, "error": type(exc).__name__})

    def _shared(self, key: str) -> _Refusals | None:
        if self.store is None:
            return None
        try:
            raw = self.store.get(_STORE_KEY + key)
            if raw is None:
                return None
            record = json.loads(raw)
            return _Refusals(_decode(record), int(record["count"]), self.clock())
        except Exception as exc:  # unreadable or unavailable: the delivery runs as a plain redelivery
            logger.warning("follow_up_not_read", extra={"message_id": key, "error": type(exc).__name__})
            return None

    def _unshare(self, key: str) -> None:
        if self.store is None:
            return
        try:
            self.store.delete(_STORE_KEY + key)
        except Exception:  # it expires on its own
            logger.warning("follow_up_not_forgotten", extra={"message_id": key})


#: Prefix of the state store's copy of a decided follow-up, by message id.
_STORE_KEY = "follow-up:"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _encode(follow_up: FollowUp) -> dict[str, Any]:
    if isinstance(follow_up, RetryFollowUp):
        return {"kind": "retry", "message": _b64(follow_up.message.encode()), "delay_ms": follow_up.delay_ms}
    return {
        "kind": "dead_letter",
        "message": _b64(follow_up.message.encode()),
        "body": _b64(follow_up.body),
        "headers": follow_up.headers,
    }


def _decode(record: dict[str, Any]) -> FollowUp:
    message: Message[Any] = Message.decode(base64.b64decode(record["message"]))
    if record["kind"] == "retry":
        return RetryFollowUp(message, int(record["delay_ms"]))
    return DeadLetterFollowUp(base64.b64decode(record["body"]), dict(record["headers"]), message)
