"""Cancellation: a job marked cancelled in the state store is skipped on arrival or interrupted.

``actors.workflows.cancel(id)`` marks message ids in the store (with a TTL: the marks survive
worker restarts and reach every host); a workflow's cancel marks each unfinished member as that
workflow's member only (the pair of its message id and the workflow's id), so the same message in
another workflow, or sent on its own, runs on. A message that arrives marked is not run: it is acked,
not retried and not dead-lettered, with the option :data:`CANCELLED` set for the hooks after it
(status ``cancelled``, its result a ``JobCancelled`` failure, its idempotency key forgotten by
:class:`ForgetCancelledKeys`). A
job already running is interrupted by :class:`~jobsystem.runtime.cancellation.CancelWatch`,
which raises ``JobCancelled`` in its thread within about one poll interval, unless its actor is
declared ``interruptible=False``.

Arrivals are checked against the marks the process's poller knows, without a round trip; the
store is asked directly only while the poller is not up to date, for an actor that is not
interruptible (a mark made since the last poll could not stop it later), for a message older than
the poller remembers, and for a workflow's later step: its workflow may have been cancelled after
the step before it was counted complete and before the step was sent, so it arrives marked at
once, sooner than a poll could tell. When the store is asked about a workflow's member, the same
call also reads whether its workflow is recorded cancelled: the marks expire after
``CANCEL_TTL_MS``, and a step sent just as its workflow was cancelled, delayed longer than that,
arrives with none left; the workflow's record lives as long as the step's delay. A job that is not
a workflow's member costs no more than before: its workflow's id is read from its options, and
the poller's answer is one dict lookup more for a member only.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import dramatiq
from dramatiq.broker import Broker, MessageProxy
from dramatiq.middleware import Middleware, SkipMessage

from jobsystem.privacy.outage_lines import log_outage
from jobsystem.runtime.cancellation import CANCELLED, CancelWatch, JobCancelled
from jobsystem.runtime.coalesce import Coalescer
from jobsystem.runtime.options import option_of
from jobsystem.runtime.workflow_steps import WORKFLOW
from jobsystem.store.base import StateStore, StoreUnavailable
from jobsystem.store.cancel_marks import cancel_marks
from jobsystem.store.workflows import Arrival, workflow_backend
from middleware.guard import FailClosed
from middleware.idempotency import Idempotency

__all__ = ["Cancellation", "ForgetCancelledKeys", "is_cancelled"]

logger = logging.getLogger(__name__)


def is_cancelled(message: MessageProxy, exception: BaseException | None = None) -> bool:
    """Whether ``message`` was skipped because it was cancelled, or interrupted (``exception``)."""
    return isinstance(exception, JobCancelled) or bool(message.options.get(CANCELLED))


class Cancellation(FailClosed):
    """Skip cancelled messages on arrival and interrupt cancelled running jobs.

    Parameters:
      store: the shared state store holding the cancellation marks.
      keep_ms: how long a mark is kept (``CANCEL_TTL_MS``).
      poll_interval: seconds between two polls for new marks (one store call each).

    Place it before RateLimits and Idempotency: a cancelled message spends no token and takes no
    claim. A store that cannot be asked on arrival defers the message (fail closed).
    """

    defer_option = "cancellation_store_waits"

    def __init__(self, store: StateStore, *, keep_ms: int, poll_interval: float = 0.5) -> None:
        self.backend = cancel_marks(store)
        self.workflows = workflow_backend(store)
        # Each arrival asked about: its message id, and its workflow's id if it is a member.
        self.checks: Coalescer[Arrival, bool] = Coalescer(self._check_many)
        self.watch = CancelWatch(self.backend.cancelled_since, keep_ms=keep_ms, interval=poll_interval)

    @property
    def actor_options(self) -> set[str]:
        return {"interruptible"}

    def _check_many(self, arrivals: list[Arrival]) -> list[bool]:
        """One store call for a batch of arrivals: the marks by id alone when none is a
        workflow's member, else the marks (by id, and each member's in its own workflow) and the
        members' workflows together, each arrival answered for its own workflow (one message may
        arrive as a member of two workflows in one batch)."""
        if any(w is not None for _, w in arrivals):
            return self.workflows.cancelled_among(arrivals)
        cancelled = self.backend.cancelled_among(list(dict.fromkeys(m for m, _ in arrivals)))
        return [m in cancelled for m, _ in arrivals]

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        interruptible = option_of(broker, message, "interruptible", True)
        message_id, workflow_id = message.message_id, _workflow_of(message)
        # Known to the poller and not marked: the job is registered as running in the same step,
        # unless the store must confirm (the job cannot be interrupted later, outlived the poller,
        # or is a workflow's step sent just as its workflow may have been cancelled).
        confirm = not interruptible or self._outlived_watch(message) or _later_step(message)
        cancelled = self.watch.arrived(message_id, workflow_id, start=not confirm)
        if cancelled is None or (not cancelled and confirm):
            try:
                # The store's own answer (of a workflow's member: its workflow's too).
                cancelled = self.checks.call((message_id, workflow_id))
            except StoreUnavailable as exc:  # foreseen (no answer): a warning, not guard_failed
                log_outage(
                    logger, logging.WARNING, "cancellation_store_unavailable", exc, message_id=message_id
                )
                self.defer(broker, message, reason="store_unavailable")
            if not cancelled and interruptible:
                self.watch.started(message_id, workflow_id)
        if cancelled:
            message.options[CANCELLED] = True
            logger.info("job_cancelled", extra={"message_id": message_id, "running": False})
            raise SkipMessage("cancelled")

    def _outlived_watch(self, message: MessageProxy) -> bool:
        """Whether ``message`` was sent longer ago than the poller remembers marks: a job that
        waited weeks in the delay cascade may carry a mark the poller has already forgotten."""
        return time.time() * 1000 - message.message_timestamp > self.watch.keep_ms // 2

    def after_process_message(
        self,
        broker: Broker,
        message: MessageProxy,
        *,
        result: Any | None = None,
        exception: BaseException | None = None,
    ) -> None:
        self.watch.ended(message.message_id)
        if isinstance(exception, JobCancelled):
            logger.info("job_cancelled", extra={"message_id": message.message_id, "running": True})

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        self.watch.ended(message.message_id)

    def after_worker_shutdown(self, broker: Broker, worker: dramatiq.Worker) -> None:
        self.watch.stop()


def _later_step(message: MessageProxy) -> bool:
    """Whether ``message`` is a step of a workflow after its first: sent by the worker that
    counted the step before it complete, which a cancel of the workflow landing between that
    count and the send does not stop. The cancel marked the step first, in the store, but this
    process's poller may not know it yet: a step that started would run until the next poll."""
    option = message.options.get(WORKFLOW)
    return isinstance(option, dict) and int(option.get("step") or 0) > 0


def _workflow_of(message: MessageProxy) -> str | None:
    """The id of the workflow ``message`` is a member of, or None: a workflow's cancel stops its
    members in that workflow only, and a store check of a member also asks whether its workflow
    was cancelled, whose mark on the member may have expired."""
    option = message.options.get(WORKFLOW)
    return str(option["id"]) if isinstance(option, dict) and option.get("id") else None


class ForgetCancelledKeys(Middleware):
    """The first of the after hooks: end the job's cancellation watch, then forget a cancelled
    job's idempotency key (delete it unless done) before anything says the job was cancelled.

    Dramatiq runs ``after_*`` hooks in reverse order: place it last, so that its hooks run before
    all the others. Ending the watch there keeps a cancel that arrives once the actor returned from
    being raised into the other middleware's after hooks (a workflow's next step half sent, a
    status half written); Cancellation's own ``ended`` comes later and is a no-op then. The key is
    forgotten before StoreResults and Status say the job was cancelled, so that a caller who re-sends
    with the same key is not told it is a duplicate. Idempotency's own give-back of the claim comes
    later and is a no-op then (it only touches a claim its owner still holds). A key that cannot be
    forgotten (store down) stays: a re-send is then reported as a duplicate, never run twice.
    """

    def __init__(self) -> None:
        self._watches: list[CancelWatch] | None = None  # looked up once, at the first job's end

    def _end_watch(self, broker: Broker, message: MessageProxy) -> None:
        if self._watches is None:
            self._watches = [m.watch for m in broker.middleware if isinstance(m, Cancellation)]
        for watch in self._watches:
            watch.ended(message.message_id)

    def after_process_message(
        self,
        broker: Broker,
        message: MessageProxy,
        *,
        result: Any | None = None,
        exception: BaseException | None = None,
    ) -> None:
        self._end_watch(broker, message)
        if is_cancelled(message, exception):
            self._forget_key(broker, message)

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        self._end_watch(broker, message)
        if is_cancelled(message):
            self._forget_key(broker, message)

    def _forget_key(self, broker: Broker, message: MessageProxy) -> None:
        for middleware in broker.middleware:
            if isinstance(middleware, Idempotency):
                key = middleware.key_of(broker, message)
                if key is None:
                    continue
                try:
                    middleware.backend.forget_many([key])
                except StoreUnavailable as exc:
                    log_outage(
                        logger, logging.WARNING, "cancelled_key_kept", exc, message_id=message.message_id
                    )
