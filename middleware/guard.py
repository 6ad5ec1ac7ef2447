"""Fail closed by construction: the base class of every middleware that guards something.

Dramatiq's broker calls middleware hooks through ``emit_before``, which logs and swallows any
exception that is not a ``MiddlewareError``, and ``emit_after``, which swallows everything. So a
guard that raises by accident (a store error reply, a bug, a reply of the wrong shape) lets the job
run with no claim and no token, publishes a send unchecked, or lets the skip path ack a message
that was never re-enqueued. Subclasses of :class:`FailClosed` cannot do that: every hook they
define is wrapped when the class is created, and the unexpected becomes

- **defer** in ``before_process_message``: the message is re-enqueued with a growing delay,
  spending no retry, and skipped; it runs once the guard can decide;
- **raise to the caller** in ``before_enqueue`` / ``before_enqueue_batch``: the sender gets
  :attr:`FailClosed.send_error` and nothing is published;
- **logged, then** :meth:`FailClosed.after_hook_failed` in ``after_process_message`` and
  ``after_skip_message``, where a subclass makes sure the message is not lost;
- **logged** in ``on_receive`` (the consumer thread, which must keep consuming),
  ``on_dropped`` (the claims' pump, which must keep answering), ``on_unsent`` and
  ``on_unsent_batch`` (the sender gets the publish's own error).

``MiddlewareError`` subclasses (``SkipMessage`` among them) pass through unchanged: they are the
hooks' deliberate answers.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, ClassVar, NoReturn

from dramatiq.broker import Broker, MessageProxy
from dramatiq.middleware import Middleware, MiddlewareError, SkipMessage

from jobsystem.dramatiq_internals import request_redelivery
from jobsystem.privacy.outage_lines import log_outage
from jobsystem.runtime.requeue import backoff_ms, option_count, postpone

__all__ = ["FailClosed", "GuardError"]

logger = logging.getLogger(__name__)


class GuardError(MiddlewareError):
    """A guard could not check a send; nothing was published."""


def _log_failed(middleware: Middleware, hook: Callable[..., Any], exc: BaseException) -> None:
    """``guard_failed`` at ERROR (a Sentry event) naming the error's class; its text (a store
    error's names the store's host and port) in ``guard_failed_cause`` at DEBUG."""
    log_outage(
        logger, logging.ERROR, "guard_failed", exc, middleware=type(middleware).__name__, hook=hook.__name__
    )


def _guard_run(hook: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(hook)
    def guarded(self: FailClosed, broker: Broker, message: MessageProxy, *args: Any, **kwargs: Any) -> Any:
        try:
            return hook(self, broker, message, *args, **kwargs)
        except MiddlewareError:
            raise
        except Exception as exc:
            _log_failed(self, hook, exc)
            self.defer(broker, message, reason="guard_failed")

    return guarded


def _guard_send(hook: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(hook)
    def guarded(self: FailClosed, broker: Broker, *args: Any, **kwargs: Any) -> Any:
        try:
            return hook(self, broker, *args, **kwargs)
        except MiddlewareError:
            raise
        except Exception as exc:
            raise self.send_error(
                f"{type(self).__name__} could not check the send ({type(exc).__name__}); not published"
            ) from exc

    return guarded


def _guard_after(hook: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(hook)
    def guarded(self: FailClosed, broker: Broker, message: MessageProxy, *args: Any, **kwargs: Any) -> None:
        try:
            hook(self, broker, message, *args, **kwargs)
        except Exception as exc:
            _log_failed(self, hook, exc)
            try:
                self.after_hook_failed(broker, message, hook.__name__)
            except Exception:  # the last resort: put the delivery back rather than ack it
                request_redelivery(message)

    return guarded


def _guard_quiet(hook: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(hook)
    def guarded(self: FailClosed, *args: Any, **kwargs: Any) -> None:
        try:
            hook(self, *args, **kwargs)
        except Exception as exc:
            _log_failed(self, hook, exc)

    return guarded


_GUARDS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "before_process_message": _guard_run,
    "before_enqueue": _guard_send,
    "before_enqueue_batch": _guard_send,
    "after_process_message": _guard_after,
    "after_skip_message": _guard_after,
    "on_receive": _guard_quiet,
    "on_dropped": _guard_quiet,
    "on_unsent": _guard_quiet,
    "on_unsent_batch": _guard_quiet,
}


class FailClosed(Middleware):
    """A middleware whose hooks cannot fail open (see the module docstring).

    Class attributes a subclass may set:
      send_error: the ``MiddlewareError`` a sender gets when a send-side hook fails unexpectedly.
      defer_option: the message option counting consecutive deferrals (for the growing delay).
      defer_base_ms, defer_max_ms: the first deferral's delay, and the cap as it doubles.
    """

    send_error: ClassVar[type[MiddlewareError]] = GuardError
    defer_option: str = "guard_waits"
    defer_base_ms: int = 2_000
    defer_max_ms: int = 60_000

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name, guard in _GUARDS.items():
            hook = cls.__dict__.get(name)
            if hook is not None:
                setattr(cls, name, guard(hook))

    def defer(
        self, broker: Broker, message: MessageProxy, *, reason: str, options: dict[str, Any] | None = None
    ) -> NoReturn:
        """Re-enqueue ``message`` after a delay that doubles with each consecutive deferral (no
        retry spent), then skip it. Never returns."""
        waits = option_count(message.options.get(self.defer_option))
        delay = backoff_ms(waits, self.defer_base_ms, self.defer_max_ms)
        logger.warning(
            "job_deferred",
            extra={
                "middleware": type(self).__name__,
                "reason": reason,
                "delay_ms": delay,
                "deferrals": waits + 1,
            },
        )
        postpone(
            broker, message, delay, reason=reason, options={**(options or {}), self.defer_option: waits + 1}
        )
        raise SkipMessage(f"deferred: {reason}")

    def after_hook_failed(self, broker: Broker, message: MessageProxy, hook: str) -> None:
        """Called once an ``after_*`` hook raised; a subclass whose hook decides the message's fate
        makes sure it is not lost here (raising makes the consumer put the delivery back)."""
