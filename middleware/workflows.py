"""Workflows: count each member's end in the state store and start the next step once.

A member of a workflow (option ``workflow``, see :mod:`jobsystem.runtime.workflow_steps`) that
ends for good (succeeded, dead-lettered or cancelled) is counted with one atomic store operation
(:meth:`~jobsystem.store.workflows.WorkflowBackend.finish`); no task polls for a group's end. When
its step is complete and the workflow still runs, the member's worker sends the next step with
what the step hands on (its result, the group's results in order, or the counts). A member that
did not succeed fails a chord: the next step is never sent and the workflow names the member.
So does a member whose result the next step is to get but that cannot be kept (larger than
``result_max_bytes`` as JSON, or not JSON): recorded ``failed`` with the reason, rather than
handing the next step a ``None`` it would take for the member's result.
A member that returned although it was cancelled while it ran (not interruptible, or it returned
before the interrupt came; the cancellation watch ends before these hooks) is counted as
cancelled by the store when its mark is there as its end is counted, so no next step follows it.

The call that completes a step answers so exactly once; a later call for the same member (the
completer's delivery again) answers so again only while the next step is not noted as sent (the
worker that completed it died, or its publish failed and its delivery was put back). Another
member delivered again is not told to send: its run may end while the completer is still
sending. Each next message carries an idempotency key made from its own id, so a step sent twice
(its worker died between the publish and the note) still runs once: the copy is skipped at run.
A next step a middleware refuses at send for good (:func:`refused_for_good`) fails the workflow
and the member is acked; an outage puts the member back. A dead member replayed from the dead
letters that succeeds is counted again (see ``WorkflowBackend.finish``), and a member re-enqueued
with a delay that could outlive its workflow's record (longer than the TTL / ``KEEP_FRACTION``)
keeps the record for it (:meth:`Workflows.before_enqueue`). Best-effort, by choice: the send this
hook runs before is often a deferral, how a job waits out a store outage, and refusing it for the
same outage left the job nowhere to go; a record that did expire is logged (``workflow_gone``)
when the member ends. Never on a RabbitMQ consumer's own thread
(:mod:`jobsystem.runtime.consumer_thread`), where a store timeout would hold up consuming.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from typing import Any

from dramatiq import Message
from dramatiq.broker import Broker, MessageProxy
from dramatiq.errors import BrokerError
from dramatiq.middleware import MiddlewareError

from jobsystem.dramatiq_internals import release_thread_connection, request_redelivery, wants_redelivery
from jobsystem.privacy.outage_lines import log_outage
from jobsystem.runtime.consumer_thread import on_consumer_thread
from jobsystem.runtime.idempotency_keys import CompletedDuplicate
from jobsystem.runtime.message_shape import int_option
from jobsystem.runtime.options import option_of
from jobsystem.runtime.result_json import result_json, why_not_kept
from jobsystem.runtime.workflow_steps import WORKFLOW, keyed_by_id, next_messages
from jobsystem.store.base import StateStore, StoreUnavailable
from jobsystem.store.cancel_marks import CancelMarks, cancel_marks
from jobsystem.store.idempotency import KeyRecord
from jobsystem.store.workflows import StepProgress, WorkflowBackend, workflow_backend
from middleware.cancellation import is_cancelled
from middleware.dead_letters import REPLAYS
from middleware.guard import FailClosed
from middleware.idempotency import Idempotency, IdempotencyStoreError

__all__ = ["Workflows", "find_workflows", "refused_for_good"]

logger = logging.getLogger(__name__)

#: A delay longer than the TTL divided by this keeps the workflow's record (see
#: :meth:`Workflows._outlives`): 10, a delay longer than 2.4 h with the default TTL of a day.
KEEP_FRACTION = 10


class Workflows(FailClosed):
    """Count workflow members' ends and send each next step once.

    Parameters:
      store: the shared state store.
      ttl_ms: how long a workflow's record is kept after its last change.
      cancel_ttl_ms: how long a cancellation mark is kept (``actors.workflows.cancel``).
      result_max_bytes: a member's result larger than this once JSON-encoded is not kept; the
        member fails its workflow when the next step is to get it.
      dead_retry_s: first wait before counting a dead-lettered member again when the store did not
        answer (it doubles, up to a minute).
    """

    def __init__(
        self,
        store: StateStore,
        *,
        ttl_ms: int,
        cancel_ttl_ms: int,
        result_max_bytes: int = 65_536,
        dead_retry_s: float = 1.0,
    ) -> None:
        self.backend: WorkflowBackend = workflow_backend(store)
        self.marks: CancelMarks = cancel_marks(store)
        self.ttl_ms = ttl_ms
        self.cancel_ttl_ms = cancel_ttl_ms
        self.result_max_bytes = result_max_bytes
        self.dead_retry_s = dead_retry_s

    def before_enqueue(self, broker: Broker, message: Message[Any], delay: int | None) -> None:
        """A member re-enqueued with a delay must find its workflow when it ends: a delay that
        could outlive the record keeps it the delay and the TTL from now, best-effort and not on
        a consumer's thread (see the module)."""
        option = message.options.get(WORKFLOW)
        if not (delay and isinstance(option, dict) and self._outlives(delay)) or on_consumer_thread():
            return
        workflow_id = str(option.get("id"))
        try:
            self.backend.keep(workflow_id, int(option["step"]), self.ttl_ms + int(delay))
        except Exception as exc:
            fields = {"workflow_id": workflow_id, "message_id": message.message_id, "delay_ms": int(delay)}
            log_outage(logger, logging.WARNING, "workflow_keep_failed", exc, **fields)

    def _outlives(self, delay: int) -> bool:
        """Whether a member re-enqueued with ``delay`` could end after its workflow's record (the
        TTL after its last change) expired, unless it waited or ran for most of the TTL first."""
        return delay * KEEP_FRACTION > self.ttl_ms

    def after_process_message(
        self,
        broker: Broker,
        message: MessageProxy,
        *,
        result: Any | None = None,
        exception: BaseException | None = None,
    ) -> None:
        if exception is None:
            self._finish(broker, message, "succeeded", result)
        elif is_cancelled(message, exception):
            self._finish(broker, message, "cancelled", None)

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        skipped = sys.exc_info()[1]
        if is_cancelled(message):
            self._finish(broker, message, "cancelled", None)
        elif isinstance(skipped, CompletedDuplicate):
            # Its key was completed by an earlier run: that run's end may not have been counted,
            # or the next step it completed not sent (its publish failed and the delivery came
            # back). Counting again is a no-op once counted, and sends the step if still due.
            # A key that kept no result (too large) has none to hand on: not a None.
            kept = skipped.result is not None
            self._finish(broker, message, "succeeded", _decoded(skipped.result) if kept else NOT_KEPT)

    def after_nack(self, broker: Broker, message: MessageProxy) -> None:
        if wants_redelivery(message) or not isinstance(message.options.get(WORKFLOW), dict):
            return
        self._record_dead(broker, message, time.monotonic() + self.ttl_ms / 1000, self.dead_retry_s)

    def _record_dead(self, broker: Broker, message: MessageProxy, deadline: float, wait_s: float) -> None:
        """Count a dead-lettered member. Its delivery is gone, so nothing redelivers it: while
        the store does not answer, try again (doubling waits up to a minute) until the workflow's
        record would have expired anyway."""
        try:
            self._finish(broker, message, "dead", None)
            return
        except Exception as exc:
            retry = time.monotonic() + wait_s < deadline
            log_outage(
                logger,
                logging.ERROR,
                "workflow_member_unrecorded",
                exc,
                message_id=message.message_id,
                retry_in_s=wait_s if retry else None,
            )
        if retry:
            again = threading.Timer(
                wait_s, self._record_dead_later, (broker, message, deadline, min(wait_s * 2, 60.0))
            )
            again.daemon = True
            again.start()

    def _record_dead_later(
        self, broker: Broker, message: MessageProxy, deadline: float, wait_s: float
    ) -> None:
        """:meth:`_record_dead` on a timer's thread, which then ends: the RabbitMQ connection it
        opened to send the next step (the broker keeps one per thread) is closed, or each retry
        that sent a step left one open for the life of the worker."""
        try:
            self._record_dead(broker, message, deadline, wait_s)
        finally:
            release_thread_connection(broker)

    def after_hook_failed(self, broker: Broker, message: MessageProxy, hook: str) -> None:
        # The member's end was not counted (store down) or its next step not sent: run it again
        # rather than leave the workflow waiting forever.
        request_redelivery(message)

    def _finish(self, broker: Broker, message: MessageProxy, state: str, result: Any) -> None:
        """Count the member's end (see :meth:`member_finished`). A next step the send refused for
        good fails the workflow here: its delivery put back would run it again, to be refused
        again, for ever. Anything else raised puts it back (fail closed: no count is lost)."""
        try:
            self.member_finished(broker, message, state, result)
        except MiddlewareError as exc:
            if not refused_for_good(exc):
                raise
            self._record_refused(message, exc)

    def _record_refused(self, message: MessageProxy, exc: MiddlewareError) -> None:
        """Record the member ``failed`` (the reason names the refusal's class only: its text may
        quote the piped data) and its workflow failed; the delivery is then acked."""
        option = message.options[WORKFLOW]
        reason = f"next step refused at send ({type(exc).__name__})"
        self.backend.fail_member(
            str(option["id"]), int(option["step"]), message.message_id, reason, self.ttl_ms
        )
        logger.error(
            "workflow_step_refused",
            extra={
                "workflow_id": option["id"],
                "step": option["step"],
                "message_id": message.message_id,
                "error": type(exc).__name__,
            },
        )

    def duplicate_finished(self, broker: Broker, message: Message[Any]) -> None:
        """Count a member dropped at send as the duplicate of an earlier message with its
        idempotency key: it will not run in this workflow, its original's run is its end. An
        original that completed hands on its result (kept by the key). One still pending or
        running (or whose key is gone) cannot be waited for here: the member is counted
        ``failed`` with the reason (a chord fails rather than hand on a ``None`` it never got)."""
        original = _original_key(broker, message)
        if original is not None and original.state == "done":
            result = _decoded(original.result) if original.result else NOT_KEPT
            self.member_finished(broker, message, "succeeded", result)
            return
        logger.warning(
            "workflow_member_duplicate_unfinished",
            extra={"message_id": message.message_id, "key_state": original.state if original else None},
        )
        self.member_finished(broker, message, "failed", None, reason=DUPLICATE_UNFINISHED)

    def member_finished(
        self, broker: Broker, message: Any, state: str, result: Any, reason: str = ""
    ) -> None:
        """Count ``message``'s end (``state``, ``result``, why it ``failed``: ``reason``) in its
        workflow, if it is a member, and send the next step if this completed it (a sender calls
        it too: see ``jobsystem.workflow_launch``)."""
        option = message.options.get(WORKFLOW)
        if not isinstance(option, dict):
            return
        encoded = self._encode(result)
        if state == "succeeded" and not encoded and _hands_on(broker, option):
            state, reason = "failed", self._why_not_kept(result)
            logger.warning(
                "workflow_member_result_not_kept",
                extra={"workflow_id": option["id"], "message_id": message.message_id, "reason": reason},
            )
        progress = self.backend.finish(
            str(option["id"]),
            int(option["step"]),
            message.message_id,
            state,
            encoded,
            self.ttl_ms,
            reason,
            replayed=int_option(message.options, REPLAYS) > 0,
        )
        if progress.state == "unknown":  # expired or never recorded: its next step will not follow
            logger.warning(
                "workflow_gone",
                extra={"workflow_id": option["id"], "step": option["step"], "message_id": message.message_id},
            )
        logger.info(
            "workflow_member_finished",
            extra={
                "workflow_id": option["id"],
                "step": option["step"],
                "member_state": state,
                "finished": progress.finished,
                "size": progress.size,
                "workflow_state": progress.state,
            },
        )
        if progress.send_next and option.get("next"):
            longest_delay = self._send_next(broker, option, message.message_id, result, progress)
            # The record outlives the next step's delay, or its members would find it gone.
            self.backend.mark_sent(str(option["id"]), int(option["step"]), self.ttl_ms + longest_delay)

    def _send_next(
        self, broker: Broker, option: dict[str, Any], member: str, result: Any, progress: StepProgress
    ) -> int:
        """Send the next step's messages; returns the longest delay among them (ms).

        Sent again (the member that completed the step came back), the step hands on the result
        it was completed with, not the result of this later run (which may have ended otherwise)."""
        piped: Any = result
        if option.get("pipe") == "counts":
            piped = dict(progress.counts)
        elif option.get("pipe") == "list" or not progress.added:
            record = self.backend.get(str(option["id"]))
            if record is None:
                raise StoreUnavailable("the workflow's record is gone")
            if option.get("pipe") == "list":
                piped = record.step_results(int(option["step"]))
            elif member in record.kept:  # not kept (too large): this run's is all there is
                piped = record.results[member]
        longest_delay = 0
        for message in next_messages(
            option, piped, ignores_pipe=lambda m: option_of(broker, m, "pipe_ignore")
        ):
            delay = message.options.get("delay")
            longest_delay = max(longest_delay, int(delay or 0))
            sent = broker.enqueue(keyed_by_id(broker, message), delay=delay)
            if sent.options.get("duplicate"):  # dropped at send: it will not run here
                self.duplicate_finished(broker, message)
        logger.info(
            "workflow_step_sent", extra={"workflow_id": option["id"], "step": int(option["step"]) + 1}
        )
        return longest_delay

    def _encode(self, result: Any) -> str:
        """``result`` as JSON, or empty when too large to keep (a kept ``None`` is ``null``)."""
        if result is NOT_KEPT:
            return ""
        return result_json(result, self.result_max_bytes) or ""

    def _why_not_kept(self, result: Any) -> str:
        if result is NOT_KEPT:
            return "result not kept by its idempotency key (too large): nothing to hand on"
        return why_not_kept(result, self.result_max_bytes)


#: The result of a member skipped as the duplicate of a run whose key kept no result.
NOT_KEPT: Any = object()

#: Why a member dropped at send as a duplicate failed its workflow (no data of the job).
DUPLICATE_UNFINISHED = (
    "dropped at send as the duplicate of a message with its idempotency key that has not "
    "completed: its end cannot be counted in this workflow"
)


def _original_key(broker: Broker, message: Message[Any]) -> KeyRecord | None:
    """What the store knows of ``message``'s idempotency key (its original's state and result),
    or None without an Idempotency middleware or a key. Raises ``StoreUnavailable``."""
    for middleware in broker.middleware:
        if isinstance(middleware, Idempotency):
            key = middleware.key_of(broker, message)
            return None if key is None else middleware.backend.lookup(key)
    return None


def _hands_on(broker: Broker, option: dict[str, Any]) -> bool:
    """Whether the member's result is an argument of the next step: its step pipes results
    (``value``, ``list``) and a next message does not ignore the pipe (``pipe_ignore``)."""
    if option.get("pipe") not in ("value", "list"):
        return False
    nexts: list[Message[Any]] = [Message(**data) for data in option.get("next") or []]
    return any(not option_of(broker, m, "pipe_ignore") for m in nexts)


#: What a send's error says of a dependency that did not answer (not of the send itself).
_OUTAGES = (StoreUnavailable, IdempotencyStoreError, OSError, BrokerError)
#: The clients whose own errors, left untranslated by a guard, are outages too.
_CLIENTS = ("redis", "sqlite3", "pika")


def refused_for_good(exc: BaseException) -> bool:
    """Whether a send's error is a middleware's refusal that a later try gets again (a bad
    idempotency key, a guard's no): a ``MiddlewareError`` with no outage (store, connection) in
    it or among its causes. An outage, or anything else, is worth another try."""
    if not isinstance(exc, MiddlewareError):
        return False
    seen: BaseException | None = exc
    for _ in range(8):  # a chain of causes is short; a cycle must not loop
        if seen is None:
            return True
        if isinstance(seen, _OUTAGES) or type(seen).__module__.partition(".")[0] in _CLIENTS:
            return False
        seen = seen.__cause__ or seen.__context__
    return False


def _decoded(result: str | None) -> Any:
    """A result as its run recorded it (JSON), or None."""
    try:
        return json.loads(result) if result else None
    except ValueError:
        return None


def find_workflows(broker: Broker) -> Workflows:
    """The :class:`Workflows` middleware of ``broker``; RuntimeError when it has none."""
    for middleware in broker.middleware:
        if isinstance(middleware, Workflows):
            return middleware
    raise RuntimeError("this broker has no Workflows middleware (build it with jobsystem.system)")
