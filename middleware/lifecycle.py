"""Job lifecycle events in the logs, and the job's context on every line logged while it runs.

Events: ``job_enqueued`` (DEBUG: producers send thousands at once), ``job_started``,
``job_succeeded`` (with ``duration_ms``), ``job_failed`` (exception type and scrubbed message),
``job_retry_scheduled`` (``delay_ms``), ``job_dead_lettered`` and ``job_skipped``. While a job runs,
``message_id``, ``actor``, ``queue`` and ``attempt`` are bound in structlog's context variables,
so every structlog and standard-library line logged inside the actor carries them. ``actor`` is
the name of one of the broker's actors, else ``unknown``: a message's actor name is the sender's
text, which for no registered actor may be anything (an e-mail address, a person's name).

Arguments are not logged: personal data travels in them. An actor that wants them in
``job_started`` opts in with ``@dramatiq.actor(log_args=True)``; they are then logged by
parameter name (so the scrubber can judge each by its key) and only after ``scrub``.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Container, Mapping
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any

import structlog
from dramatiq import Message, Worker
from dramatiq.broker import Broker, MessageProxy
from dramatiq.common import q_name
from dramatiq.errors import ActorNotFound
from dramatiq.middleware import Middleware

from jobsystem.dramatiq_internals import dead_letter_reason, wants_redelivery
from jobsystem.runtime.actor_names import actor_label
from jobsystem.runtime.cancellation import JobCancelled
from jobsystem.runtime.message_shape import int_option

__all__ = ["DEFAULT_LOGGER", "JobLifecycle", "job_fields"]


@dataclass
class _Job:
    """The job this worker thread is running."""

    fields: dict[str, Any]
    started: float
    tokens: Mapping[str, Token[Any]] | None
    retry_delay: int | None = None

    @property
    def message_id(self) -> Any:
        return self.fields["message_id"]


#: The logger lifecycle events go to unless told otherwise.
DEFAULT_LOGGER = "jobs.lifecycle"

_current: ContextVar[_Job | None] = ContextVar("lifecycle_job", default=None)


def job_fields(message: Message[Any] | MessageProxy, known: Container[str]) -> dict[str, Any]:
    """The job context of ``message``: the fields every line about it carries. ``known``: the
    broker's actors; a name none of them has is the sender's text, logged as ``unknown``."""
    return {
        "message_id": message.message_id,
        "actor": actor_label(message.actor_name, known),
        "queue": q_name(message.queue_name),
        "attempt": int_option(message.options, "retries") + 1,
    }


class JobLifecycle(Middleware):
    """Log each job's lifecycle and bind its context; see the module's docstring.

    Parameters:
      scrub: applied to exception messages and opted-in arguments before they are logged.
      logger_name: the structlog logger the events go to.
      enqueued_level: level of ``job_enqueued`` (DEBUG by default).
      clock: monotonic seconds, for durations.
      flush_logs: called when the worker has stopped, before Dramatiq closes the log pipe: sends
        lifecycle lines still held in a batch (see ``jobsystem.observability.batched_stream``).
      write_line: writes an INFO event (logger name, event, fields) the way the logging chain
        would, without the chain, and returns ``False`` where the event must be logged the
        ordinary way (see ``jobsystem.observability.job_lines``). Without it, every event is.
    """

    def __init__(
        self,
        *,
        scrub: Callable[[Any], Any],
        logger_name: str = DEFAULT_LOGGER,
        enqueued_level: int = logging.DEBUG,
        clock: Callable[[], float] = time.perf_counter,
        flush_logs: Callable[[], None] | None = None,
        write_line: Callable[[str, str, dict[str, Any]], bool] | None = None,
    ) -> None:
        self.scrub = scrub
        self.flush_logs = flush_logs
        self.write_line = write_line
        self.logger_name = logger_name
        self.logger: structlog.stdlib.BoundLogger = structlog.get_logger(logger_name)
        self.enqueued_level = enqueued_level
        self.clock = clock
        # Delayed messages held by this process: their move to the work queue is no new enqueue.
        self._held: set[str] = set()

    @property
    def actor_options(self) -> set[str]:
        return {"log_args"}

    # --- enqueue side ---

    def after_enqueue(self, broker: Broker, message: Message[Any], delay: int | None) -> None:
        job = _current.get()
        if job is not None and delay is not None and job.message_id == message.message_id:
            job.retry_delay = delay  # Retries re-enqueueing the running job: logged with its failure
            return
        if delay is None and message.message_id in self._held:
            self._held.discard(message.message_id)
            return
        delayed = {"delay_ms": delay} if delay is not None else {}
        self.logger.log(self.enqueued_level, "job_enqueued", **job_fields(message, broker.actors), **delayed)

    def before_delay_message(self, broker: Broker, message: MessageProxy) -> None:
        self._held.add(message.message_id)

    # --- worker side ---

    def after_worker_shutdown(self, broker: Broker, worker: Worker) -> None:
        if self.flush_logs is not None:
            self.flush_logs()

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        fields = job_fields(message, broker.actors)
        tokens = structlog.contextvars.bind_contextvars(**fields)
        _current.set(_Job(fields, self.clock(), tokens))
        if self._logs_args(broker, message):
            self._info("job_started", args=self.scrub(self._arguments(broker, message)))
        else:
            self._info("job_started")

    def after_process_message(
        self,
        broker: Broker,
        message: MessageProxy,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        job = _current.get()
        duration_ms = round((self.clock() - job.started) * 1000, 3) if job else None
        if exception is None:
            self._info("job_succeeded", duration_ms=duration_ms)
        elif isinstance(exception, JobCancelled):
            self._info("job_interrupted", duration_ms=duration_ms)
        else:
            # Runs after Retries (emit_after is reversed): ``failed`` says whether a retry follows.
            level = logging.ERROR if message.failed else logging.WARNING
            self.logger.log(
                level,
                "job_failed",
                exc_type=type(exception).__name__,
                error=self.scrub(str(exception)),
                duration_ms=duration_ms,
            )
            if not message.failed and job is not None and job.retry_delay is not None:
                self._info("job_retry_scheduled", delay_ms=job.retry_delay)
        self._end(job)

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        self.logger.warning("job_skipped", **job_fields(message, broker.actors))
        self._end(_current.get())

    def after_nack(self, broker: Broker, message: MessageProxy) -> None:
        # A nack moves the message to the dead letters (retries exhausted, ``throws``, age limit,
        # unknown actor). It runs once the job context is unbound: the fields are passed, those of
        # the attempt that just ended when this thread ran it (Retries has counted it since).
        job = _current.get()
        fields = job.fields if job is not None and job.message_id == message.message_id else None
        if wants_redelivery(message):  # the dead letter could not be published: requeued instead
            self.logger.error("job_requeued", **(fields or job_fields(message, broker.actors)))
            return
        reason = dead_letter_reason(message)
        self.logger.error(
            "job_dead_lettered", reason=reason, **(fields or job_fields(message, broker.actors))
        )

    # --- helpers ---

    def _info(self, event: str, **fields: Any) -> None:
        """An INFO event: written by ``write_line`` where it can, else through structlog."""
        if self.write_line is None or not self.write_line(self.logger_name, event, fields):
            self.logger.info(event, **fields)

    def _end(self, job: _Job | None) -> None:
        """Unbind the job's context; the job stays known to this thread for ``after_nack``."""
        if job is not None and job.tokens is not None:
            structlog.contextvars.reset_contextvars(**job.tokens)
            job.tokens = None

    @staticmethod
    def _logs_args(broker: Broker, message: MessageProxy) -> bool:
        try:
            return bool(broker.get_actor(message.actor_name).options.get("log_args"))
        except ActorNotFound:
            return False

    @staticmethod
    def _arguments(broker: Broker, message: MessageProxy) -> dict[str, Any]:
        """The arguments by parameter name, so each is judged by its name (``email=...``).

        Positional arguments that do not bind to the signature are counted, not shown: without a
        name, a person's name among them cannot be told from any other word."""
        try:
            signature = inspect.signature(broker.get_actor(message.actor_name).fn)
            return dict(signature.bind_partial(*message.args, **message.kwargs).arguments)
        except (TypeError, ValueError, ActorNotFound):
            return {"args": f"<{len(message.args)} not bound, hidden>", "kwargs": dict(message.kwargs)}
