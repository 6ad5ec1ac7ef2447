"""Hooks called only on the middleware that have them.

Dramatiq's ``Broker.emit_before``/``emit_after`` call the named hook on every middleware, most of
them the base class's empty method: with this project's twenty middleware, a job's four signals
(``process_message`` before and after, ``ack`` before and after) make about eighty calls, half of
them to nothing. :class:`HookDispatch` keeps, per hook, the middleware whose class defines it, and
calls those, with Dramatiq's own error rules: a ``MiddlewareError`` from a ``before_`` hook
reaches the caller, any other exception is logged CRITICAL and the next middleware runs.

The list is rebuilt whenever ``broker.middleware`` changes (compared by identity at each emit),
so middleware added or removed later are seen at once.
"""

from __future__ import annotations

from typing import Any

from dramatiq.middleware import Middleware, MiddlewareError

__all__ = ["HookDispatch"]

_Listeners = tuple[Middleware, ...]


def _defines(middleware: Middleware, name: str) -> bool:
    """Whether ``middleware`` has its own ``name`` hook (not the base class's empty one)."""
    base = getattr(Middleware, name, None)
    return base is None or name in vars(middleware) or getattr(type(middleware), name, None) is not base


class HookDispatch:
    """A ``dramatiq.Broker`` mixin (first among the bases) whose emits skip the empty hooks."""

    middleware: list[Middleware]
    logger: Any

    def _listeners(self, name: str, *, reverse: bool) -> _Listeners:
        current = tuple(self.middleware)
        cache: dict[str, tuple[_Listeners, _Listeners]] = self.__dict__.setdefault("_hook_listeners", {})
        cached = cache.get(name)
        if cached is not None and cached[0] == current:
            return cached[1]
        ordered = reversed(current) if reverse else current
        listeners = tuple(m for m in ordered if _defines(m, name))
        cache[name] = (current, listeners)
        return listeners

    def emit_before(self, signal: str, *args: Any, **kwargs: Any) -> None:
        name = "before_" + signal
        for middleware in self._listeners(name, reverse=False):
            try:
                getattr(middleware, name)(self, *args, **kwargs)
            except MiddlewareError:
                raise
            except Exception:
                self.logger.critical("Unexpected failure in %s of %r.", name, middleware, exc_info=True)

    def emit_after(self, signal: str, *args: Any, **kwargs: Any) -> None:
        name = "after_" + signal
        for middleware in self._listeners(name, reverse=True):
            try:
                getattr(middleware, name)(self, *args, **kwargs)
            except Exception:
                self.logger.critical("Unexpected failure in %s of %r.", name, middleware, exc_info=True)
