"""Host names resolved by a deadline: ``getaddrinfo`` in a daemon thread, waited for no longer.

``getaddrinfo`` cannot be interrupted, and a resolver that does not answer (a DNS server gone, a
search domain timing out: glibc waits 5 s per server and attempt) holds the calling thread as
long as it likes, a health check's or a dashboard request's. Here the lookup runs in a thread of
its own and the caller waits for it until its deadline, then raises :class:`~jobsystem.ops.deadline.Late`;
the lookup's thread ends when the resolver answers. At most :data:`MAX_LOOKUPS` lookups run at
once in a process: while that many hang, a new one waits for a free thread until its deadline,
so a resolver that never answers costs that many threads, never one per call. An address given
as one (``127.0.0.1``, ``::1``) is not looked up.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import threading

from jobsystem.ops.deadline import Deadline, Late

__all__ = ["MAX_LOOKUPS", "resolve"]

#: The most lookups running at once in a process (each in a daemon thread of its own).
MAX_LOOKUPS = 4

_slots = threading.BoundedSemaphore(MAX_LOOKUPS)


def _fresh_slots() -> None:
    """A forked child has none of its parent's lookup threads: none of their slots is taken."""
    global _slots
    _slots = threading.BoundedSemaphore(MAX_LOOKUPS)


os.register_at_fork(after_in_child=_fresh_slots)


class _Lookup:
    """One ``getaddrinfo`` in a daemon thread, which gives its slot back when it returns."""

    def __init__(self, host: str, port: int, family: int, slots: threading.BoundedSemaphore) -> None:
        self.done = threading.Event()
        self.addresses: list[str] = []
        self.error: OSError | None = None
        self._query = (host, port, family)
        self._slots = slots

    def run(self) -> None:
        host, port, family = self._query
        try:
            found = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)
            self.addresses = list(dict.fromkeys(str(info[4][0]) for info in found))
        except OSError as exc:  # socket.gaierror, mostly: the caller raises it
            self.error = exc
        finally:
            self._slots.release()
            self.done.set()


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def resolve(host: str, port: int, deadline: Deadline, family: int = socket.AF_UNSPEC) -> list[str]:
    """The addresses of ``host`` (as ``getaddrinfo`` orders them, each once), looked up by
    ``deadline``. Raises :class:`Late` past it, and what ``getaddrinfo`` raised (``socket.gaierror``)."""
    host = host.strip("[]")
    if _is_address(host):
        return [host]
    slots = _slots
    if not slots.acquire(timeout=deadline.remaining()):
        raise Late(f"no free lookup thread within {deadline.seconds:g} s ({MAX_LOOKUPS} lookups hanging)")
    lookup = _Lookup(host, port, family, slots)
    try:
        threading.Thread(target=lookup.run, name="resolver", daemon=True).start()
    except BaseException:
        slots.release()
        raise
    if not lookup.done.wait(deadline.remaining()):
        raise Late(f"name not resolved within {deadline.seconds:g} s")
    if lookup.error is not None:
        raise lookup.error
    return lookup.addresses
