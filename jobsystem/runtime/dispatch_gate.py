"""A delivery handed to the worker threads only once what its receipt started has answered.

A middleware's ``on_receive`` hook may start a store round trip for a delivery (the idempotency
claim sent ahead). Handed to the work queue at once, the delivery is often taken by an idle worker
thread before the answer is in, and that thread then blocks on it: one more sleep and wake-up per
job, each a GIL hand-off. Held until the answer is in, the delivery reaches the work queue from the
thread that received the answer, and the worker thread that takes it runs without waiting.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["DispatchGate"]


class DispatchGate:
    """Counts the holds taken on one delivery; the last release hands the delivery on.

    The receiver holds the gate while the hooks run and gives its own hold up with :meth:`close`;
    a hook that starts something takes a hold with :meth:`hold` (on the receiving thread, before
    :meth:`close`) and calls the release it gets once (a second call does nothing), from any thread.

    Parameters:
      dispatch: hands the delivery to the worker threads; called at most once, by the release
        that ends the last hold, when that comes after :meth:`close`.
    """

    __slots__ = ("_dispatch", "_holds", "_lock")

    def __init__(self, dispatch: Callable[[], None]) -> None:
        self._dispatch = dispatch
        self._holds = 1  # the receiver's own, until close()
        # Made by the first hold (on the receiving thread, before close): most deliveries take none.
        self._lock: threading.Lock | None = None

    def hold(self) -> Callable[[], None]:
        """Take a hold: the delivery waits until the returned release is called."""
        lock = self._lock
        if lock is None:
            lock = self._lock = threading.Lock()
        with lock:
            self._holds += 1
        released = False

        def release() -> None:
            nonlocal released
            with lock:
                if released:
                    return
                released = True
                self._holds -= 1
                last = self._holds == 0
            if last:
                self._dispatch()

        return release

    def close(self) -> bool:
        """Give up the receiver's own hold. True when nothing holds the delivery any more: the
        receiver hands it on itself, and ``dispatch`` is never called; False when a release to
        come will call ``dispatch``."""
        if self._lock is None:  # never held
            return True
        with self._lock:
            self._holds -= 1
            return self._holds == 0
