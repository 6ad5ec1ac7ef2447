"""The ``dramatiq`` command line ``jobctl worker`` becomes: the settings' processes, threads and
shutdown timeout, and the ``--queues`` names as every other ``jobctl --queue`` takes them.

A worker given a queue none of its actors declares consumes nothing, for good and without a
word: under a ``QUEUE_PREFIX`` the plain name (``media``) is this environment's queue
(``<prefix>media``, :func:`~jobsystem.ops.queue_names.own_queue`), and a name that is neither an
actor's queue nor one RabbitMQ has is refused (exit code 2) before the worker starts.
"""

from __future__ import annotations

from collections.abc import Collection

from jobctl.project import fail
from jobsystem.settings import Settings
from jobsystem.system import System

__all__ = ["dramatiq_argv", "leading_modules", "with_worker_queues"]

_QUEUE_OPTIONS = ("-Q", "--queues")


def _first_option(arguments: tuple[str, ...]) -> int:
    return next((i for i, a in enumerate(arguments) if a.startswith("-")), len(arguments))


def leading_modules(arguments: tuple[str, ...]) -> tuple[str, ...]:
    """The modules ``dramatiq`` takes: the leading ``arguments`` up to the first option."""
    return arguments[: _first_option(arguments)]


def dramatiq_argv(executable: str, settings: Settings, arguments: tuple[str, ...]) -> list[str]:
    """``dramatiq actors`` with the settings' processes, threads and shutdown timeout.

    Dramatiq takes modules right after its broker module: the leading ``arguments`` up to the
    first option. Everything from that option on (``-Q a b`` included) comes after the options
    set here, so the caller's win.
    """
    first = _first_option(arguments)
    return [
        executable,
        "actors",
        *arguments[:first],
        "--processes",
        str(settings.worker_processes),
        "--threads",
        str(settings.worker_threads),
        "--worker-shutdown-timeout",
        str(settings.worker_shutdown_timeout_ms),
        *arguments[first:],
    ]


def _worker_queue(settings: Settings, name: str, own: Collection[str]) -> str:
    """The queue a worker consumes for ``name``: an actor's queue (``own_queue``), else the
    prefixed name when RabbitMQ has it; exit 2 naming ``name`` when it is neither."""
    from jobsystem.ops.queue_counts import missing_queues
    from jobsystem.ops.queue_names import own_queue

    queue = own_queue(settings, name, own)
    if queue in own:
        return queue
    try:
        missing = missing_queues(settings, [queue])
    except ConnectionError:  # the worker itself then says RabbitMQ is unreachable
        return queue
    if missing:
        fail(
            f"jobctl: --queues {name!r}: no actor declares queue {queue!r} and RabbitMQ has no such "
            "queue (a worker given it would consume nothing)"
        )
    return queue


def with_worker_queues(system: System, arguments: tuple[str, ...]) -> tuple[str, ...]:
    """``arguments`` with each name of ``-Q``/``--queues`` (``--queues=a`` too) resolved by
    :func:`_worker_queue`; the actors of the modules given must be declared already."""
    if not any(a in _QUEUE_OPTIONS or a.startswith("--queues=") for a in arguments):
        return arguments
    from jobsystem.rabbitmq.broker import actor_queues

    settings, own = system.settings, actor_queues(system.broker)
    resolved: list[str] = []
    taking = False
    for argument in arguments:
        if argument.startswith("--queues="):
            resolved.append(f"--queues={_worker_queue(settings, argument.split('=', 1)[1], own)}")
            taking = False
        elif argument.startswith("-"):
            resolved.append(argument)
            taking = argument in _QUEUE_OPTIONS
        else:
            resolved.append(_worker_queue(settings, argument, own) if taking else argument)
    return tuple(resolved)
