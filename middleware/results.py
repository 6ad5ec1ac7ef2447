"""Dramatiq's ``Results`` middleware, told apart a deferral, a duplicate and a cancellation.

Dramatiq stores ``None`` as the result of every message skipped without failing. Here a message
that was only deferred (re-enqueued to run later) stores nothing, a duplicate skipped after its
original completed leaves the original's result in place, and a cancelled job stores a
``JobCancelled`` failure, so ``get_result`` raises instead of answering ``None``. A failed job's
error is stored scrubbed (:class:`~jobsystem.store.results.StoreResultBackend`) once it failed
for good (``after_nack``: the final attempt's error, after Retries gave up).
"""

from __future__ import annotations

from typing import Any

from dramatiq import Message
from dramatiq.broker import Broker, MessageProxy
from dramatiq.results import Results

from jobsystem.dramatiq_internals import wants_redelivery
from jobsystem.runtime.attempts import AttemptTracker
from jobsystem.runtime.cancellation import JobCancelled
from jobsystem.store.results import StoreResultBackend
from middleware.cancellation import is_cancelled

__all__ = ["StoreResults"]


class StoreResults(Results):
    """Keep the results of actors declared ``store_results=True`` in the state store.

    Parameters:
      backend: the result backend over the state store.
      result_ttl: milliseconds a result is kept (actor option ``result_ttl`` overrides it).

    Place it after Retries and the middleware that defer (idempotency, rate limits), like Status.
    """

    backend: StoreResultBackend

    def __init__(self, backend: StoreResultBackend, *, result_ttl: int) -> None:
        super().__init__(backend=backend, result_ttl=result_ttl)  # type: ignore[no-untyped-call]
        self.attempts = AttemptTracker()

    def after_enqueue(self, broker: Broker, message: Message[Any], delay: int | None) -> None:
        self.attempts.enqueued(message, delay)

    def after_process_message(
        self,
        broker: Broker,
        message: MessageProxy,
        *,
        result: Any | None = None,
        exception: BaseException | None = None,
    ) -> None:
        if is_cancelled(message, exception):
            self._store_cancelled(broker, message)
            return
        # Dramatiq's own hook also warns about every value returned by an actor that does not
        # store results (most of them, on purpose): only the storing is kept.
        store_results, ttl = self._lookup_options(broker, message)  # type: ignore[no-untyped-call]
        if store_results and exception is None:
            self.backend.store_result(message, result, ttl)

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        if is_cancelled(message):
            self._store_cancelled(broker, message)
            return
        if message.failed or self.attempts.deferred(message.message_id) or wants_redelivery(message):
            return  # nacked next (after_nack stores the error), or it runs later
        store_results, ttl = self._lookup_options(broker, message)  # type: ignore[no-untyped-call]
        if store_results and not self.backend.has_result(message):
            self.backend.store_result(message, None, ttl)

    def after_ack(self, broker: Broker, message: MessageProxy) -> None:
        self.attempts.done()

    def after_nack(self, broker: Broker, message: MessageProxy) -> None:
        self.attempts.done()
        if wants_redelivery(message):
            return  # its dead letter was refused: held and requeued, not failed yet
        super().after_nack(broker, message)  # type: ignore[no-untyped-call]

    def _store_cancelled(self, broker: Broker, message: MessageProxy) -> None:
        store_results, ttl = self._lookup_options(broker, message)  # type: ignore[no-untyped-call]
        if store_results:
            self.backend.store_exception(message, JobCancelled("the job was cancelled"), ttl)
