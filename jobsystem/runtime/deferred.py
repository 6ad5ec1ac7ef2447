"""Writes to the state store that need not block a worker thread, batched on a background thread.

A completion mark or a status update can reach the store a few milliseconds after the job; what
matters is that the worker thread does not wait for it. Writes submitted together go out in one
batch (on Redis one Lua call per kind of write, on SQLite one transaction). A batch that fails in
a way that passes (:func:`~jobsystem.store.failures.transient`: a lost connection, ``OOM``,
``READONLY``, a busy SQLite file) is retried, in order, until the store answers again.

A failure that would come back on every retry (a ``WRONGTYPE`` reply for a key holding another
type, a script's own error, a bug in a kind's code) is no outage: retried, it held every later
write of the process (every job's status and completion) behind it for good, and dropping the whole
batch lost the other kinds' writes with it. The failed kind's writes are dropped alone (one ERROR
line, ``deferred_write_dropped``, naming the kind, the count and the error by its class, see
:func:`~jobsystem.privacy.outage_lines.failure_fields`) and the others written one kind at a time,
each in a batch of its own.

A store that refuses the configuration (``NOAUTH``, ``WRONGPASS``, ``NOPERM``, a database index it
lacks: :func:`~jobsystem.store.failures.misconfigured`) is mended by an operator, or by a new
connection (a proxy whose Redis restarted answers ``NOAUTH`` on a connection opened before: the
store drops the connection that got such a reply, and the next try logs in again). A write that a
guarantee rests on (an idempotency completion or release: dropped, the key stays pending and a
redelivered copy runs the job again) is never dropped for it: it is retried, waiting
``retry_delay`` doubled at each refusal in a row up to ``max_retry_delay``, with the writes queued
behind it. A kind of write marked :func:`best_effort` (a status record, an index entry) is dropped
at its first refusal instead. Either way a kind's first refusal is one ERROR line
(``deferred_writes_refused`` for a kind kept, ``deferred_write_dropped`` for one dropped), each
later one a DEBUG line only, until a write of the kind goes through again
(``deferred_writes_resumed`` at INFO, with the count of its writes dropped meanwhile).

A retry writes again exactly what the failure undid. On SQLite that is every group of the batch:
one group's error (a busy lock, a full disk) rolls back the groups before it too. On Redis each
group's script stood as it returned, so the groups before the failed one are not sent again (a
counter would count twice). A kind of write whose submitted items only name entries of a buffer
(:class:`Buffered`: status updates, coalesced per message) has those entries taken out once per
batch, and the batch keeps them until it commits: taken again on the retry, they would be gone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from jobsystem.privacy.outage_lines import log_outage
from jobsystem.store.base import StateStore
from jobsystem.store.failures import misconfigured, transient

#: Applies many queued items of one kind to a batch view of the store, in one operation if it can.
ApplyMany = Callable[[StateStore, list[Any]], None]

__all__ = ["ApplyMany", "Buffered", "DeferredWrites", "best_effort", "is_best_effort"]

logger = logging.getLogger(__name__)

_Apply = TypeVar("_Apply", bound=Callable[..., Any])

#: Where :func:`best_effort` marks a kind of write (on the function: its bound methods show it too).
_BEST_EFFORT = "deferred_best_effort"


def best_effort(apply_many: _Apply) -> _Apply:
    """Mark a kind of write that no guarantee rests on (a status record, an index entry): a
    misconfigured store's refusal drops it rather than holding the writes queued behind it.
    Unmarked kinds are kept until the store takes them."""
    setattr(apply_many, _BEST_EFFORT, True)
    return apply_many


def is_best_effort(apply_many: Callable[..., Any]) -> bool:
    """Whether ``apply_many`` (a function, a bound method, a callable object) is :func:`best_effort`."""
    return getattr(apply_many, _BEST_EFFORT, False) is True


class Buffered:
    """A kind of write whose items are keys of its owner's buffer: ``take(keys)`` moves their
    writes out of the buffer (once per batch, on the writer's thread), ``apply(view, writes)``
    writes them (again on each retry). Hashed by identity: submit the same instance each time."""

    __slots__ = ("apply", "take")

    def __init__(self, take: Callable[[list[Any]], list[Any]], apply: ApplyMany) -> None:
        self.take = take
        self.apply = apply


class DeferredWrites:
    """A background thread that applies submitted writes to ``store`` in batches."""

    def __init__(
        self,
        store: StateStore,
        *,
        max_batch: int = 1000,
        linger: float = 0.005,
        retry_delay: float = 0.5,
        max_retry_delay: float = 30.0,
    ) -> None:
        self.store = store
        self.max_batch = max_batch
        self.linger = linger
        self.retry_delay = retry_delay
        self.max_retry_delay = max_retry_delay
        #: How many times in a row a kept kind of write was refused (its retries back off).
        self._refusals = 0
        self._pending: deque[tuple[ApplyMany | Buffered, Any]] = deque()
        self._wakeup = threading.Condition()
        self._idle = threading.Event()
        self._idle.set()
        self._thread: threading.Thread | None = None
        self._stopping = False
        #: Per kind of write a misconfigured store refused since the first was logged, how many of
        #: its writes were dropped meanwhile (none for a kind kept).
        self._refused: dict[str, int] = {}
        #: The groups of the batch being written (and retried), for :meth:`_given_up`.
        self._writing: list[_Group] = []
        #: ``deferred_writes_given_up`` was logged, and the writer has not drained since.
        self._said_given_up = False

    def submit(self, apply_many: ApplyMany | Buffered, item: Any) -> None:
        """Queue ``item``, to be applied by ``apply_many(view, [item, ...])`` (for a
        :class:`Buffered`, by its ``apply`` to what its ``take`` returns); never blocks on the store."""
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
        """Apply what is queued (waiting up to ``timeout``) and end the thread. Writes still not
        applied then are given up (the process exits without them), and said so (see
        :meth:`_given_up`)."""
        if not self.flush(timeout) and not self._said_given_up:  # one line for a writer stopped twice
            self._given_up(timeout)
        with self._wakeup:
            self._stopping = True
            self._wakeup.notify()

    def _given_up(self, waited: float) -> None:
        """One ERROR line, ``deferred_writes_given_up``: the kinds of write left unapplied and how
        many of each (never their items: keys, the jobs' contents). A completion or release given
        up leaves its key leased until the lease lapses (a copy of the message then runs the job
        again); a status record stays as it was."""
        with self._wakeup:
            left = [*self._writing, *_by_kind(self._pending).items()]
        kinds: dict[str, int] = {}
        for apply_many, items in left:
            kinds[_kind(apply_many)] = kinds.get(_kind(apply_many), 0) + len(items)
        if kinds:
            fields = {"kinds": kinds, "writes": sum(kinds.values()), "waited_s": waited}
            logger.error("deferred_writes_given_up", extra=fields)
            self._said_given_up = True

    def _take(self) -> list[tuple[ApplyMany | Buffered, Any]]:
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
                self._said_given_up = False
                self._idle.set()
                return
            self._write(batch)

    def _write(self, batch: list[tuple[ApplyMany | Buffered, Any]]) -> None:
        """Apply ``batch`` in one store batch, retried while its failure passes; a kind of write
        that fails for good is dropped alone, the others written."""
        try:
            groups = _grouped(batch)
        except Exception as exc:
            log_outage(logger, logging.ERROR, "deferred_write_dropped", exc, kind="batch", writes=len(batch))
            return
        while groups:
            self._writing = groups
            groups = self._apply(groups, len(batch))
            if groups:
                time.sleep(self._retry_pause())
        self._writing = []

    def _retry_pause(self) -> float:
        """``retry_delay``; after refusals in a row, doubled at each up to ``max_retry_delay``."""
        if not self._refusals:
            return self.retry_delay
        doubled: float = self.retry_delay * 2.0 ** min(self._refusals - 1, 32)
        return min(doubled, max(self.max_retry_delay, self.retry_delay))

    def _apply(self, groups: list[_Group], writes: int) -> list[_Group]:
        """Apply ``groups`` in one store batch; returns those to write again after a failure that
        passes or a refusal of a kind kept (none when written). After any other failure, the failed
        group is the one that raised: on Redis it is dropped as it is (the writes of its own before
        the failure stood, and would count twice); the groups the failure undid are written one by
        one."""
        applied = 0
        try:
            with self.store.batch() as view:
                for apply_many, items in groups:
                    apply_many(view, items)
                    applied += 1
            self._served(groups)
            return []
        except Exception as exc:
            failed = groups[applied] if applied < len(groups) else None
            if self._passes(exc, writes) or (failed is not None and self._kept(failed, exc)):
                # On Redis the groups before the failed one stood: written again, a counter counts twice.
                return groups if self.store.atomic_batch else groups[applied:]
            if self.store.atomic_batch:
                return self._one_by_one(groups)
            if failed is not None:
                self._dropped(failed, exc)
            return self._one_by_one(groups[applied + 1 :])

    def _one_by_one(self, groups: list[_Group]) -> list[_Group]:
        """Apply each group in a store batch of its own, dropping those that fail for good; returns
        the groups left to retry from the first that failed in a way that passes, or was refused
        and is kept."""
        for index, group in enumerate(groups):
            apply_many, items = group
            try:
                with self.store.batch() as view:
                    apply_many(view, items)
            except Exception as exc:
                if self._passes(exc, len(items)) or self._kept(group, exc):
                    return groups[index:]
                self._dropped(group, exc)
            else:
                self._served([group])
        return []

    def _passes(self, exc: Exception, writes: int) -> bool:
        """Whether ``exc`` passes (an outage: logged at WARNING, retried every ``retry_delay``)."""
        if not transient(exc):
            return False
        self._refusals = 0
        log_outage(logger, logging.WARNING, "deferred_writes_failed", exc, writes=writes)
        return True

    def _kept(self, group: _Group, exc: Exception) -> bool:
        """Whether ``group`` is kept to retry after ``exc``: a misconfigured store's refusal of a
        kind a guarantee rests on (not :func:`best_effort`). Its first refusal is an ERROR line,
        later ones DEBUG; its retries back off."""
        apply_many, items = group
        if not misconfigured(exc) or is_best_effort(apply_many):
            return False
        kind = _kind(apply_many)
        level = logging.DEBUG if kind in self._refused else logging.ERROR
        self._refused.setdefault(kind, 0)
        self._refusals += 1
        log_outage(logger, level, "deferred_writes_refused", exc, kind=kind, writes=len(items))
        return True

    def _dropped(self, group: _Group, exc: Exception) -> None:
        """Log a group of writes that failed in a way no retry mends: its kind of write (its apply
        function, by qualified name), how many, and the error by class (its text at DEBUG), never
        the items, whose contents are the jobs'. A misconfigured store's refusals after the first
        are logged at DEBUG, and counted."""
        apply_many, items = group
        kind = _kind(apply_many)
        level = logging.ERROR
        if misconfigured(exc):
            level = logging.DEBUG if kind in self._refused else logging.ERROR
            self._refused[kind] = self._refused.get(kind, 0) + len(items)
        log_outage(logger, level, "deferred_write_dropped", exc, kind=kind, writes=len(items))

    def _served(self, groups: list[_Group]) -> None:
        """``groups`` were written: the store refuses their kinds of write no more."""
        self._refusals = 0
        if not self._refused:
            return
        for apply_many, _ in groups:
            kind = _kind(apply_many)
            dropped = self._refused.pop(kind, None)
            if dropped is not None:
                logger.info("deferred_writes_resumed", extra={"kind": kind, "dropped": dropped})


#: One kind of write and its items (a :class:`Buffered` kind's already taken from its buffer).
_Group = tuple[ApplyMany, list[Any]]


def _kind(apply_many: ApplyMany | Buffered) -> str:
    """A kind of write as the log names it: its apply function's qualified name."""
    if isinstance(apply_many, Buffered):
        apply_many = apply_many.apply
    return getattr(apply_many, "__qualname__", type(apply_many).__qualname__)


def _by_kind(batch: Iterable[tuple[ApplyMany | Buffered, Any]]) -> dict[ApplyMany | Buffered, list[Any]]:
    """The batch's items per kind of write, in the order each kind first came."""
    groups: dict[ApplyMany | Buffered, list[Any]] = {}
    for apply_many, item in batch:
        groups.setdefault(apply_many, []).append(item)
    return groups


def _grouped(batch: list[tuple[ApplyMany | Buffered, Any]]) -> list[_Group]:
    """The batch's items per kind of write (:func:`_by_kind`); a :class:`Buffered` kind's writes
    taken out of its buffer now, so that a retry of the batch applies them again."""
    return [
        (kind.apply, kind.take(items)) if isinstance(kind, Buffered) else (kind, items)
        for kind, items in _by_kind(batch).items()
    ]
