"""Job results in the state store: the backend of Dramatiq's ``Results`` middleware.

Dramatiq's ``ResultBackend`` does the polling, the keys (an MD5 of namespace, queue, actor and
message id: no personal data in a key name) and the wrapping of errors; this backend only keeps
the encoded value under ``result:<key>`` with its TTL, on Redis or SQLite alike. A failure is
stored with its message passed through ``scrub``: results are read by other processes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dramatiq.results import ResultBackend
from dramatiq.results.backend import Missing, MResult, Result
from dramatiq.results.result import wrap_exception

from jobsystem.store.base import StateStore

__all__ = ["StoreResultBackend"]


def _identity(text: str) -> str:
    return text


class StoreResultBackend(ResultBackend):
    """Dramatiq's result backend interface over a :class:`~jobsystem.store.base.StateStore`.

    Parameters:
      store: the shared state store.
      scrub: applied to an error's message before it is stored.
    """

    def __init__(self, store: StateStore, *, scrub: Callable[[str], str] = _identity) -> None:
        super().__init__(namespace="results")
        self.store = store
        self.scrub = scrub

    def store_exception(self, message: Any, exception: BaseException, ttl: int) -> None:
        wrapped = wrap_exception(exception)  # type: ignore[no-untyped-call]
        wrapped["exn"]["msg"] = self.scrub(str(wrapped["exn"]["msg"]))[:1_000]
        self._store(self.build_message_key(message), wrapped, ttl)

    def has_result(self, message: Any) -> bool:
        """Whether a result (or failure) of ``message`` is stored."""
        return self._get(self.build_message_key(message)) is not Missing

    def _get(self, message_key: str) -> MResult:
        raw = self.store.get(f"result:{message_key}")
        if raw is None:
            return Missing
        return self.encoder.decode(raw)

    def _store(self, message_key: str, result: Result, ttl: int) -> None:
        self.store.set(f"result:{message_key}", self.encoder.encode(result), ttl_ms=int(ttl))
