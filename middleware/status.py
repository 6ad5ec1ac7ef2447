"""Job status and progress: what each message is doing, for applications to show and operators to read.

Each message id gets a record in the state store: its state (``queued`` at send, or
``scheduled`` with its due time when sent with a delay past ``scheduled_after_ms`` (it then waits
in RabbitMQ's delay cascade and is filed in the queue's scheduled index), ``running``,
``failed`` after an attempt raised, ``retrying`` once Retries re-enqueued it, then ``succeeded``,
``dead``, ``skipped`` or ``cancelled``), actor, queue, attempts, times, the progress the actor reports with
:func:`progress`, the last failure's error and traceback (passed through ``scrub``) and a small
JSON result. The arguments are recorded (scrubbed, at most ``args_max_chars``) only for an actor
that opts in with ``dashboard_args=True`` (declared by :class:`middleware.heartbeat.Heartbeat`):
they may carry personal data that no pattern finds.

No write blocks a worker thread or a sender: updates go to a per-process buffer drained by
:class:`~jobsystem.runtime.deferred.DeferredWrites`, many records per Lua call or transaction. A progress
report replaces the previous one of the same message still in the buffer, so an actor may report
as often as it likes: at most one progress write per message per flush reaches the store.

Place the middleware after Retries and after any middleware that may skip or defer a message
(idempotency, rate limits): its ``before_process_message`` then runs only for a message that is
about to run, and its ``after_process_message`` sees the attempt before Retries decides about it
(see :mod:`jobsystem.runtime.attempts`).
"""

from __future__ import annotations

import atexit
import contextvars
import json
import logging
import math
import threading
import time
import traceback
from collections.abc import Callable, Container
from typing import Any

import dramatiq
from dramatiq import Message
from dramatiq.broker import Broker, MessageProxy
from dramatiq.common import q_name
from dramatiq.middleware import CurrentMessage, Middleware

from jobsystem.dramatiq_internals import wants_redelivery
from jobsystem.runtime.actor_names import actor_label
from jobsystem.runtime.attempts import AttemptTracker
from jobsystem.runtime.cancellation import CANCELLED, JobCancelled
from jobsystem.runtime.deferred import Buffered, DeferredWrites, best_effort
from jobsystem.runtime.options import option_of
from jobsystem.runtime.result_json import result_json
from jobsystem.store.base import StateStore
from jobsystem.store.status import StatusBackend, status_backend
from jobsystem.store.status_records import JobStatus, StatusUpdate, order_of
from middleware.dead_letters import REPLAYS

__all__ = ["Status", "find_status", "progress"]

logger = logging.getLogger(__name__)

#: The Status middleware of the message running in this context (the worker's broker may not be
#: the global one, e.g. in tests): set before the actor runs, read by :func:`progress` and
#: :meth:`Status._enqueue_known`. A context variable, not a thread mark: Dramatiq's AsyncIO event
#: loop runs an ``async def`` actor in a copy of its worker thread's context (``asyncio.to_thread``
#: carries it on), so the coroutine counts as running an actor; a thread started without it
#: (``loop.run_in_executor``, a ``ThreadPoolExecutor``) does not, and fails closed.
_ACTIVE: contextvars.ContextVar[Status | None] = contextvars.ContextVar("job_status_active", default=None)


#: The once-fields of a progress report: none (shared, never changed).
_NO_FIELDS: dict[str, str] = {}


def _identity(value: Any) -> Any:
    return value


def _now_ms() -> str:
    return str(int(time.time() * 1000))


class Status(Middleware):
    """Record every message's status in the shared state store.

    Parameters:
      store: the shared state store.
      ttl_ms: how long a record is kept after its last change.
      scrub: applied to error messages, tracebacks, progress notes and shown arguments before
        they are stored (personal data stays out).
      scrub_value: applied to the arguments an actor shows before they are encoded: a value under
        a personal-data key (``address``, ``name``) is removed whole, which no text scrub of the
        JSON can do for a dict or a list.
      result_max_bytes: a result larger than this once JSON-encoded, or not JSON, is not stored.
      error_max_chars: error messages are cut to this length.
      traceback_max_chars: tracebacks are cut to their last this many characters.
      args_max_chars: the arguments of an actor that opts in, as JSON, are cut to this length.
      max_pending: messages with updates held while the store does not answer (besides those of
        the batch being retried); past this, new ones are dropped (status is best effort: the jobs
        themselves never wait for it).
      writes: the background writer the updates go through (shared with
        :class:`~middleware.idempotency.Idempotency`: one batch carries a job's completion and outcome).
      scheduled_after_ms: a message enqueued with a longer delay (a send, a retry's backoff, a
        deferral) is recorded ``scheduled`` with its due time: the broker's delay horizon, past
        which it waits in RabbitMQ rather than in a worker.
    """

    def __init__(
        self,
        store: StateStore,
        *,
        ttl_ms: int = 86_400_000,
        scrub: Callable[[str], str] = _identity,
        scrub_value: Callable[[Any], Any] = _identity,
        result_max_bytes: int = 4_096,
        error_max_chars: int = 1_000,
        traceback_max_chars: int = 4_000,
        args_max_chars: int = 2_000,
        max_pending: int = 100_000,
        writes: DeferredWrites | None = None,
        scheduled_after_ms: int = 30_000,
    ) -> None:
        self.store = store
        self.scheduled_after_ms = scheduled_after_ms
        self.backend: StatusBackend = status_backend(store)
        self.ttl_ms = ttl_ms
        self.scrub = scrub
        self.scrub_value = scrub_value
        self.result_max_bytes = result_max_bytes
        self.error_max_chars = error_max_chars
        self.traceback_max_chars = traceback_max_chars
        self.args_max_chars = args_max_chars
        self.max_pending = max_pending
        self.writes = writes or DeferredWrites(store)
        self.attempts = AttemptTracker()
        self._pending: dict[str, list[StatusUpdate]] = {}
        self._writer = Buffered(self._take_updates, self._apply_updates)
        self._lock = threading.Lock()
        self._dropping = False
        #: Set when this process boots a worker (see :meth:`_enqueue_known`).
        self._in_worker = False
        # A sender that exits right after a send still writes its ``queued`` records.
        atexit.register(self.flush, 2.0)

    # -- reading ---------------------------------------------------------------------------------

    def get(self, message_id: str) -> JobStatus | None:
        """The status of ``message_id``; None when unknown, expired, or not written yet (a few ms)."""
        return self.backend.get(message_id)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the updates made so far are in the store; False on timeout."""
        return self.writes.flush(timeout)

    # -- writing ---------------------------------------------------------------------------------

    def _submit(self, update: StatusUpdate) -> None:
        with self._lock:
            queued = self._pending.get(update.message_id)
            if queued is None:
                if len(self._pending) >= self.max_pending:
                    if not self._dropping:
                        logger.warning("status_updates_dropped", extra={"pending": len(self._pending)})
                    self._dropping = True
                    return
                self._dropping = False
                self._pending[update.message_id] = [update]
            elif update.progress_only and queued[-1].progress_only:
                queued[-1] = update
                return
            else:
                queued.append(update)
                return
        self.writes.submit(self._writer, update.message_id)

    def _take_updates(self, message_ids: list[str]) -> list[StatusUpdate]:
        """The buffered updates of ``message_ids``, taken out of the buffer once per batch
        (DeferredWrites calls it): the batch keeps them until it commits, so a retry after any of
        its groups failed (a rolled-back SQLite transaction undid this one's writes too) writes them
        again; a later update of the same message is buffered anew, for a later batch."""
        with self._lock:
            return [u for mid in dict.fromkeys(message_ids) for u in self._pending.pop(mid, [])]

    @best_effort  # a status record: a misconfigured store may drop it
    def _apply_updates(self, view: StateStore, updates: list[StatusUpdate]) -> None:
        """Write ``updates`` in one store operation, inside the batch's (DeferredWrites calls it)."""
        self.backend.apply(updates, self.ttl_ms)

    def _update(
        self,
        known: Container[str] | None,
        message: Message[Any] | MessageProxy,
        state: str | None,
        attempt: int,
        fields: dict[str, str] | None = None,
        *,
        delete: tuple[str, ...] = (),
        rank: str | None = None,
        now: str | None = None,
    ) -> None:
        """Submit a change; ``known``: the broker's actors (the record names an actor only when it
        is one of them: another name is the sender's text), None where a sender writes it (a
        service may send to actors it does not import: any name of an actor's shape is kept);
        ``rank``: the state whose place in the order it takes (default ``state``); ``now``: the
        time of the change, when the caller read it already (ms, as text)."""
        queue = q_name(message.queue_name)
        values = {"updated_at": now or _now_ms()}
        if fields:
            values.update(fields)
        once = _NO_FIELDS
        if state is not None:
            values["state"] = state
            once = {
                "actor": actor_label(message.actor_name, known),
                "queue": queue,
                "enqueued_at": str(message.message_timestamp),
            }
        replays = message.options.get(REPLAYS)
        order = order_of(attempt, rank or state or "running", int(replays) if replays else 0)
        self._submit(StatusUpdate(message.message_id, queue, order, values, once, delete))

    def report_progress(self, message: Message[Any] | MessageProxy, value: float, note: str | None) -> None:
        """Record ``value`` (clamped to 0..1) and ``note`` as the progress of the message's attempt."""
        if math.isnan(value):
            return
        fields = {"progress": f"{min(max(value, 0.0), 1.0):.4g}"}
        if note is not None:
            fields["note"] = self.scrub(note)[:200]  # scrubbed whole: a cut value escapes its pattern
        # No state, so no once-fields: the actor is not written (nor needed).
        self._update((), message, None, message.options.get("retries", 0) + 1, fields)

    def _enqueue_known(self, broker: Broker) -> Container[str] | None:
        """The names an ``after_enqueue`` keeps as the record's actor (written once). A sender's
        send: any of an actor's shape (None), as an actor's send from a worker (it runs in this
        context, an async actor's coroutine included). Any other enqueue in a worker is the
        worker's own move of a message it consumed (a delayed one released to its queue or moved
        into the delay cascade, a retry, a deferral), which may name no actor at all: the
        broker's actors."""
        return broker.actors if self._in_worker and _ACTIVE.get() is None else None

    # -- hooks -----------------------------------------------------------------------------------

    def before_worker_boot(self, broker: Broker, worker: dramatiq.Worker) -> None:
        self._in_worker = True

    def after_enqueue(self, broker: Broker, message: Message[Any], delay: int | None) -> None:
        known = self._enqueue_known(broker)
        kind = self.attempts.enqueued(message, delay)
        retries = int(message.options.get("retries", 0))
        eta = message.options.get("eta")
        fields = {"retry_at": str(eta)} if kind == "retry" and eta else {}
        far = bool(delay is not None and delay > self.scheduled_after_ms and eta)
        running = self.attempts.running(message.message_id) if kind == "delayed" else None
        if running is not None:
            # Put back by its own attempt (the actor raised RateLimited): it waits to run that
            # attempt again, in the place of its ``running`` state, which the re-run writes again.
            self._update(
                known,
                message,
                "scheduled" if far else "queued",
                running,
                {"due_at": str(eta)} if far else None,
                rank="running",
            )
        elif far:
            # Waits in RabbitMQ's delay cascade: scheduled until it runs (a ``queued`` written
            # when it leaves the cascade, or late by its sender, does not hide it), in the place
            # of its retrying state for a retry.
            fields["due_at"] = str(eta)
            if retries == 0:
                shown = self._shown_args(broker, message)
                fields.update({"args": shown} if shown else {})
            self._update(known, message, "scheduled", retries, fields, rank="retrying" if retries else None)
        elif kind == "retry":
            # Retries counted the failed attempt already: ``retries`` attempts have run.
            self._update(known, message, "retrying", retries, fields or None)
        elif retries == 0:
            # A send (or a deferral or delayed move of a message that never ran: it is still queued).
            shown = self._shown_args(broker, message)
            self._update(known, message, "queued", 0, {"args": shown} if shown else None)

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        _ACTIVE.set(self)
        attempt = message.options.get("retries", 0) + 1
        self.attempts.started(message.message_id, attempt)
        now = _now_ms()
        self._update(
            broker.actors,
            message,
            "running",
            attempt,
            {"attempts": str(attempt), "started_at": now},
            delete=("progress", "note", "retry_at", "due_at"),
            now=now,
        )

    def after_process_message(
        self,
        broker: Broker,
        message: MessageProxy,
        *,
        result: Any | None = None,
        exception: BaseException | None = None,
    ) -> None:
        _ACTIVE.set(None)
        attempt = message.options.get("retries", 0) + 1
        if exception is None:
            now = _now_ms()
            fields = {"finished_at": now, "progress": "1"}
            encoded = self._encode_result(result)
            if encoded is not None:
                fields["result"] = encoded
            self._update(broker.actors, message, "succeeded", attempt, fields, now=now)
            return
        if isinstance(exception, JobCancelled):
            self._update(broker.actors, message, "cancelled", attempt, {"finished_at": _now_ms()})
            return
        self.attempts.failed(message.message_id)
        error = self.scrub(str(exception))[: self.error_max_chars]
        fields = {"error_type": type(exception).__name__, "error": error, "traceback": self._trace(exception)}
        self._update(broker.actors, message, "failed", attempt, fields)

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        _ACTIVE.set(None)  # no after_process_message follows a skip: its actor no longer runs
        if message.failed:
            return  # nacked next: after_nack records it dead
        if self.attempts.deferred(message.message_id) or wants_redelivery(message):
            return  # re-enqueued to be tried again, or requeued (its copy refused): it stays queued
        attempt = message.options.get("retries", 0) + 1
        state = "cancelled" if message.options.get(CANCELLED) else "skipped"
        self._update(broker.actors, message, state, attempt, {"finished_at": _now_ms()})

    def after_nack(self, broker: Broker, message: MessageProxy) -> None:
        self.attempts.done()
        if wants_redelivery(message):
            return  # its dead letter was refused: held and requeued, dead once the consumer publishes it
        # Failed for good (retries exhausted, ``throws``, too old, unknown actor): dead-lettered.
        attempt = message.options.get("retries", 0) + 1
        self._update(broker.actors, message, "dead", attempt, {"finished_at": _now_ms()})

    def after_ack(self, broker: Broker, message: MessageProxy) -> None:
        self.attempts.done()

    def after_worker_shutdown(self, broker: Broker, worker: dramatiq.Worker) -> None:
        self.writes.stop()

    def _trace(self, exception: BaseException) -> str:
        """The traceback's last ``traceback_max_chars``, scrubbed before the cut: a value cut in
        two (a card number, an IBAN) would no longer match its pattern. Whole lines of its tail
        are scrubbed, then cut: what the cut splits then is already scrubbed."""
        trace = "".join(traceback.format_exception(exception))
        tail = trace[-(self.traceback_max_chars + 2_000) :]
        if len(tail) < len(trace):
            tail = tail.partition("\n")[2]
        return self.scrub(tail)[-self.traceback_max_chars :]

    def _shown_args(self, broker: Broker, message: Message[Any]) -> str | None:
        """The scrubbed arguments of an actor that opted in with ``dashboard_args=True``, else None."""
        if not option_of(broker, message, "dashboard_args", False):
            return None
        shown = self.scrub_value({"args": list(message.args), "kwargs": dict(message.kwargs)})
        try:
            encoded = json.dumps(shown, default=repr)
        except Exception:  # not JSON, or nested too deep
            return None
        scrubbed = self.scrub(encoded)
        if len(scrubbed) > self.args_max_chars:  # cut: no longer JSON, kept as text
            return json.dumps(scrubbed[: self.args_max_chars] + " [cut]")
        return scrubbed

    def _encode_result(self, result: Any) -> str | None:
        return None if result is None else result_json(result, self.result_max_bytes)


def find_status(broker: Broker) -> Status | None:
    """The :class:`Status` middleware of ``broker``, if it has one."""
    return next((m for m in broker.middleware if isinstance(m, Status)), None)


def progress(value: float, note: str | None = None) -> bool:
    """Report the current job's progress, ``value`` from 0 to 1, with an optional short ``note``.

    Call it from inside an actor, as often as you like: it costs a dict update, and only the
    latest value per message reaches the store per flush. Outside a job (or without the Status
    middleware) it does nothing and returns False.
    """
    message = CurrentMessage.get_current_message()
    if message is None:
        return False
    status = _ACTIVE.get() or find_status(dramatiq.get_broker())
    if status is None:
        return False
    status.report_progress(message, value, note)
    return True
