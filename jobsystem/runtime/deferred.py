"""Writes to the state store that need not block a worker thread, batched on a background thread.

A completion mark or a status update can reach the store a few milliseconds after the job; what
matters is that the worker thread does not wait for it. Writes submitted together go out in one
batch (on Redis one Lua call per kind of write, on SQLite one transaction). A batch that fails is
retried, in order, until the store answers again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from jobsystem.privacy.outage_lines import log_outage
from jobsystem.store.base import StateStore, StoreUnavailable

#: Applies many queued items of one kind to a batch view of the store, in one operation if it can.
ApplyMany = Callable[[StateStore, list[Any]], None]

logger = logging.getLogger(__name__)


class DeferredWrites:
    """A background thread that applies submitted writes to ``store`` in batches."""

    def __init__(
        self, store: StateStore, *, max_batch: int = 1000, linger: float = 0.005, retry_delay: float = 0.5
    ) -> None:
        self.store = store
        self.max_batch = max_batch
        self.linger = linger
        self.retry_delay = retry_delay
        self._pending: deque[tuple[ApplyMany, Any]] = deque()
        self._wakeup = threading.Condition()
        self._idle = threading.Event()
        self._idle.set()
        self._thread: threading.Thread | None = None
        self._stopping = False

    def submit(self, apply_many: ApplyMany, item: Any) -> None:
        """Queue ``item``, to be applied by ``apply_many(view, [item, ...])``; never blocks on the store."""
        with self._wakeup:
            self._pending.append((apply_many, item))
            self._idle.clear()
            if self._thread is None or not self._thread.is_alive():
                self._stopping = False
                self._thread = threading.Thread(target=self._run, name="deferred-writes", daemon=True)
                self._thread.start()
            if len(self._pending) == 1 or len(self._pending) >= self.max_batch:
                self._wakeup.notify()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every submitted write is applied; returns False on timeout."""
        return self._idle.wait(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """Apply what is queued (waiting up to ``timeout``) and end the thread."""
        self.flush(timeout)
        with self._wakeup:
            self._stopping = True
            self._wakeup.notify()

    def _take(self) -> list[tuple[ApplyMany, Any]]:
        with self._wakeup:
            while not self._pending and not self._stopping:
                self._idle.set()
                self._wakeup.wait()
            if self._pending and not self._stopping:
                # Let more writes arrive: one batch per few milliseconds, not one per job.
                self._wakeup.wait(self.linger)
            count = min(len(self._pending), self.max_batch)
            return [self._pending.popleft() for _ in range(count)]

    def _run(self) -> None:
        while True:
            batch = self._take()
            if not batch:
                self._idle.set()
                return
            while True:
                try:
                    groups: dict[ApplyMany, list[Any]] = {}
                    for apply_many, item in batch:
                        groups.setdefault(apply_many, []).append(item)
                    with self.store.batch() as view:
                        for apply_many, items in groups.items():
                            apply_many(view, items)
                    break
                except StoreUnavailable as exc:
                    log_outage(logger, logging.WARNING, "deferred_writes_failed", exc, writes=len(batch))
                    time.sleep(self.retry_delay)
                except Exception:
                    logger.exception("deferred_write_dropped", extra={"writes": len(batch)})
                    break
