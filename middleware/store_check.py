"""Check at worker start that the state store answers and accepts writes, and say so.

Without it a worker whose store is down or misconfigured starts quietly and defers every keyed or
rate-limited job forever. With it the operator reads one line at start: ``state_store_ready``;
or ``state_store_unavailable`` repeated every few seconds until the store answers (the worker
runs meanwhile, and guarded jobs wait: they fail closed); or, for a store that will never serve
this configuration (a database index it does not have, refused credentials, a file that is not
a database), ``state_store_misconfigured`` naming the setting, and the worker process exits with
code 2, which ``dramatiq`` passes on as its own exit code.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, NoReturn

from dramatiq.broker import Broker
from dramatiq.middleware import Middleware

from jobsystem.privacy.outage_lines import log_addresses, log_outage
from jobsystem.store.base import StateStore, StoreMisconfigured, StoreUnavailable

__all__ = ["StoreCheck"]

logger = logging.getLogger(__name__)

#: Exit code of a worker process whose store is misconfigured (Dramatiq's code for a bad import).
EXIT_MISCONFIGURED = 2


class StoreCheck(Middleware):
    """Check the state store once per worker process, at boot (see the module docstring).

    Parameters:
      store: the shared state store.
      setting: what operators call the store's configuration (e.g. ``STATE_URL``), named in errors.
      retry_s: how often an unavailable store is checked again, with a warning each time.
      on_misconfigured: called with the problem (a sentence naming the store, never its password)
        to stop the process; by default it raises ``SystemExit(2)``.
    """

    def __init__(
        self,
        store: StateStore,
        *,
        setting: str = "the state store URL",
        retry_s: float = 5.0,
        on_misconfigured: Callable[[str], NoReturn] | None = None,
    ) -> None:
        self.store = store
        self.setting = setting
        self.retry_s = retry_s
        self.on_misconfigured = on_misconfigured or _exit
        self._stop = threading.Event()

    def after_process_boot(self, broker: Broker) -> None:
        try:
            self.store.check()
        except StoreMisconfigured as exc:
            self._misconfigured(exc)
        except StoreUnavailable as exc:
            self._unavailable(exc)
            threading.Thread(target=self._keep_checking, name="store-check", daemon=True).start()
        else:
            self._ready()

    def before_worker_shutdown(self, broker: Broker, worker: object) -> None:
        self._stop.set()

    def _keep_checking(self) -> None:
        while not self._stop.wait(self.retry_s):
            try:
                self.store.check()
            except StoreUnavailable as exc:
                self._unavailable(exc)
            else:
                self._ready()
                return

    def _fields(self) -> dict[str, str]:
        """The store named by its setting and kind, not by its label (its address): an INFO or
        WARNING line is a Sentry breadcrumb on every later event of the process."""
        return {"setting": self.setting, "kind": self.store.kind}

    def _ready(self) -> None:
        logger.info("state_store_ready", extra=self._fields())
        log_addresses(logger, "state_store_ready", **self._fields(), store=self.store.label)
        if self.store.kind == "sqlite":
            logger.warning(
                "state_store_single_host",
                extra={**self._fields(), "hint": "SQLite is for a single host; use redis:// for several"},
            )

    def _outage(self, level: int, event: str, exc: StoreUnavailable, **fields: Any) -> None:
        """``event`` names the store as :meth:`_fields` does: a WARNING is a Sentry breadcrumb, a
        CRITICAL an event; the error's text, which names the address too, goes in the DEBUG twin
        (see jobsystem.privacy.outage_lines)."""
        log_outage(logger, level, event, exc, **self._fields(), **fields)

    def _unavailable(self, exc: StoreUnavailable) -> None:
        effect = "guarded jobs wait until it answers"
        self._outage(logging.WARNING, "state_store_unavailable", exc, retry_s=self.retry_s, effect=effect)

    def _misconfigured(self, exc: StoreMisconfigured) -> NoReturn:
        # The operator reads the whole problem, store and error, on stderr as the process exits.
        self._outage(logging.CRITICAL, "state_store_misconfigured", exc)
        self.on_misconfigured(f"{self.setting}: the state store {self.store.label} cannot serve: {exc}")


def _exit(problem: str) -> NoReturn:
    raise SystemExit(EXIT_MISCONFIGURED)
