"""The composition root: the one function that builds the job system, in the one order that works.

Settings, then logging and Sentry (its Dramatiq integration patches ``Broker.__init__``, so it
comes before the broker), then the state store, the middleware and the broker. Building connects
to nothing: the store and the broker connect on first use. Entry points call :func:`get_system`
(the process's one system, whose broker is Dramatiq's global broker) or :func:`build_system`
(another one, e.g. with other settings); the rest of the code is handed what it needs.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import dramatiq
from dramatiq.middleware import Middleware

from jobsystem.observability.logs import configure_logging
from jobsystem.observability.sentry import configure_sentry
from jobsystem.privacy.keyhash import KeyHasher
from jobsystem.privacy.scrub import Scrubber
from jobsystem.privacy.setup import get_key_hasher, get_scrubber
from jobsystem.rabbitmq.broker import ProjectBroker, build_broker
from jobsystem.settings import Settings, load_settings
from jobsystem.stack import build_middleware
from jobsystem.startup import configuration_checked
from jobsystem.store import StateStore, open_store

__all__ = ["System", "build_system", "get_system"]


@dataclass(frozen=True)
class System:
    """Everything a process of the job system works with, built once by :func:`build_system`."""

    settings: Settings
    scrubber: Scrubber
    key_hasher: KeyHasher
    store: StateStore
    middleware: list[Middleware]
    broker: ProjectBroker


def build_system(settings: Settings | None = None) -> System:
    """Build the system from ``settings`` (default: the environment, validated; a bad variable
    raises :class:`~jobsystem.settings.SettingsError`, or in a ``dramatiq`` worker process prints
    one line per problem and exits with code 2)."""
    if settings is None:
        with configuration_checked():
            settings = load_settings()
    scrubber, key_hasher = get_scrubber(settings), get_key_hasher(settings)
    configure_logging(settings, scrubber=scrubber)
    configure_sentry(settings, scrubber)
    store = open_store(settings.state_url, namespace=settings.state_namespace, timeout=settings.state_timeout)
    middleware = build_middleware(settings, store, scrubber=scrubber, key_hasher=key_hasher)
    broker = build_broker(settings, middleware, store)
    return System(settings, scrubber, key_hasher, store, middleware, broker)


_lock = threading.Lock()
_system: System | None = None


def get_system() -> System:
    """This process's system: built from the environment on the first call, the same one after.

    Its broker becomes Dramatiq's global broker, which ``@dramatiq.actor`` binds to when an actor
    is declared: call it before importing actor modules (``import actors`` does).
    """
    global _system
    with _lock:
        if _system is None:
            system = build_system()
            dramatiq.set_broker(system.broker)
            _system = system
        return _system
