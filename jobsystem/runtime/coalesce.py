"""Coalesce concurrent calls from many threads into one call on many items.

Worker threads that each need one store round trip before their job runs would otherwise pay the
client library's per-command cost and fight over the GIL around every socket call. Here each
thread hands its item to one pump thread and waits; the pump sends whatever has accumulated as a
single call (one Lua script for many keys, one SQLite transaction) and hands each thread its
answer. Under load the batches grow by themselves; an idle process still answers in one round trip.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

Item = TypeVar("Item")
Answer = TypeVar("Answer")


class _Pending(Generic[Item, Answer]):
    __slots__ = ("answer", "done", "error", "item")

    def __init__(self, item: Item) -> None:
        self.item = item
        self.done = threading.Lock()
        self.done.acquire()  # released by the pump once the answer is in
        self.answer: Answer | None = None
        self.error: BaseException | None = None


class Coalescer(Generic[Item, Answer]):
    """``call(item)`` from any thread; ``call_many(items)`` runs on one pump thread per process.

    ``call_many`` must return one answer per item, in order. An exception it raises is raised in
    every caller of that batch.
    """

    def __init__(self, call_many: Callable[[list[Item]], list[Answer]], *, max_batch: int = 256) -> None:
        self.call_many = call_many
        self.max_batch = max_batch
        self._queue: queue.SimpleQueue[_Pending[Item, Answer]] = queue.SimpleQueue()
        self._pump: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def call(self, item: Item) -> Answer:
        return self.wait(self.submit(item))

    def submit(self, item: Item) -> _Pending[Item, Answer]:
        """Queue ``item`` without waiting; :meth:`wait` collects its answer later."""
        if self._pump is None or not self._pump.is_alive():
            with self._start_lock:
                if self._pump is None or not self._pump.is_alive():
                    self._pump = threading.Thread(target=self._run, name="coalescer", daemon=True)
                    self._pump.start()
        pending: _Pending[Item, Answer] = _Pending(item)
        self._queue.put(pending)
        return pending

    def wait(self, pending: _Pending[Item, Answer], timeout: float | None = None) -> Answer:
        """The answer to a submitted item (raising what its call raised), as often as asked;
        :class:`TimeoutError` when it is not in within ``timeout`` seconds (None: no limit)."""
        if not pending.done.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
            raise TimeoutError("no answer yet")
        pending.done.release()  # answered for good: a later wait returns at once
        if pending.error is not None:
            raise pending.error
        return pending.answer  # type: ignore[return-value]

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < self.max_batch:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                answers = self.call_many([p.item for p in batch])
                if len(answers) != len(batch):
                    raise RuntimeError(f"call_many answered {len(answers)} of {len(batch)} items")
                for pending, answer in zip(batch, answers, strict=True):
                    pending.answer = answer
            except BaseException as exc:  # every waiter of the batch sees the failure
                for pending in batch:
                    pending.error = exc
            for pending in batch:
                pending.done.release()
