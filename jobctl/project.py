"""Load the project for a command-line program: the system built, the actors declared, bad
settings turned into one line per problem and exit code 2 instead of a traceback, and everything
the command prints from then on scrubbed (:mod:`jobctl.output`)."""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, NoReturn

import click

from jobsystem.settings import Settings, SettingsError
from jobsystem.startup import configuration_checked
from jobsystem.system import System, get_system

if TYPE_CHECKING:
    from jobsystem.ops.deadline import Deadline

#: Exit codes shared by the commands.
EXIT_OK, EXIT_DEGRADED, EXIT_UNREACHABLE = 0, 1, 2
#: Bad settings, schedules or options (the same code as a usage error).
EXIT_CONFIG = 2


def fail(message: str) -> NoReturn:
    """Print ``message`` (one line or several, each naming what is wrong) on stderr and exit 2."""
    click.echo(message.rstrip("\n"), err=True)
    sys.exit(EXIT_CONFIG)


def service_unreachable(service: str, exc: BaseException, setting: str = "") -> NoReturn:
    """Say on stderr that ``service`` did not answer, or refused (misconfigured: then which
    ``setting`` to check, by name), by its error's class only (its text names hosts and ports:
    the log gets it, at DEBUG), and exit 2."""
    from jobsystem.observability.logs import get_logger
    from jobsystem.ops.outages import unreachable

    event = service.replace(" ", "_").lower()
    get_logger("jobctl").debug(f"{event}_unreachable", cause=str(exc))
    click.echo(f"jobctl: {unreachable(service, exc, setting=setting)}", err=True)
    sys.exit(EXIT_UNREACHABLE)


def store_unreachable(exc: BaseException) -> NoReturn:
    """:func:`service_unreachable` for the state store (``STATE_URL`` to check when it refused)."""
    from jobsystem.ops.outages import STORE, STORE_SETTING

    service_unreachable(STORE, exc, STORE_SETTING)


def load_project(program: str) -> System:
    """This process's system, with the project's actors declared on its broker (``actors``)."""
    try:
        with configuration_checked():
            system = get_system()
            import actors  # noqa: F401 - declares the reference actors
    except SettingsError as exc:
        fail(exc.report(program))
    return system


def import_modules(program: str, modules: Iterable[str]) -> None:
    """Import the application's modules that declare more actors (``dramatiq actors MODULE``)."""
    for module in modules:
        try:
            with configuration_checked():
                importlib.import_module(module)
        except SettingsError as exc:
            fail(exc.report(program))
        except ImportError as exc:
            fail(f"{program}: cannot import {module}: {exc}")


def import_application(program: str, modules: Iterable[str]) -> None:
    """:func:`import_modules` found from the current directory, as ``dramatiq`` finds them."""
    sys.path.insert(0, os.getcwd())
    import_modules(program, modules)


def require_queues(
    settings: Settings, named: Mapping[str, str], timeout: float = 5.0, deadline: Deadline | None = None
) -> None:
    """Exit 2 naming each queue RabbitMQ does not have: ``named`` maps a queue to how the user
    gave it (``--queue 'emails'``); within ``timeout`` seconds, or by ``deadline`` when the command
    shares one. An unreachable RabbitMQ checks nothing: commands report it."""
    if not named:
        return
    from jobsystem.ops.queue_counts import missing_queues

    try:
        missing = missing_queues(settings, list(named), timeout, deadline)
    except ConnectionError:
        return
    vhost = settings.rabbitmq_vhost
    if missing:
        fail("\n".join(f"jobctl: {named[q]}: RabbitMQ has no queue {q!r} (vhost {vhost!r})" for q in missing))


def load_system() -> System:
    """The project for a ``jobctl`` command (exit 2 on bad settings), its output scrubbed."""
    system = load_project("jobctl")
    # A command reports an unreachable broker itself; pika's own account of it is noise here.
    logging.getLogger("pika").setLevel(logging.CRITICAL)
    from jobctl.output import protect_output

    protect_output(system.scrubber.text)  # every line printed from here on
    return system
