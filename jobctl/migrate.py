"""``jobctl migrate-queues``: recreate the project's queues declared with other arguments."""

from __future__ import annotations

import sys

import click
import requests

from jobctl.project import (
    EXIT_DEGRADED,
    fail,
    import_application,
    load_system,
    require_queues,
    service_unreachable,
)


@click.command("migrate-queues")
@click.argument("modules", nargs=-1)
@click.option("--queue", "queues", multiple=True, help="Only this queue (repeatable); default: all of them.")
def migrate_queues(modules: tuple[str, ...], queues: tuple[str, ...]) -> None:
    """Recreate the project's queues declared with other arguments (plain Dramatiq, an older
    configuration).

    MODULES: the application's modules that declare more actors, as for `jobctl worker`: only the
    queues of the actors declared (theirs and the project's) are migrated, never another
    application's queue on the vhost. Stop the workers first. Messages move to a temporary twin
    and back with confirms, and Dramatiq's old .XQ dead letters move into the project's .DLQ queues.
    """
    system = load_system()
    import_application("jobctl", modules)
    from jobsystem.ops.migration import MigrationError, foreign_queues, migrate, twins_left
    from jobsystem.ops.queue_names import own_queue
    from jobsystem.rabbitmq.broker import actor_queues

    own = actor_queues(system.broker)
    named = {own_queue(system.settings, queue, own): f"--queue {queue!r}" for queue in queues}
    # A queue an interrupted run deleted is there as its twin, whose messages this run moves back.
    twins = twins_left(system.settings, list(named))
    require_queues(system.settings, {q: how for q, how in named.items() if q not in twins})
    # Recreated with the project's arguments, another application's queue would break it.
    foreign = foreign_queues(system.broker, named)
    if foreign:
        fail("\n".join(f"jobctl: {named[q]}: {q!r} is not a queue of the project's actors" for q in foreign))
    try:
        report = migrate(system.broker, system.settings, list(named) or None)
    except MigrationError as exc:
        click.echo(f"jobctl: {exc}", err=True)
        sys.exit(EXIT_DEGRADED)
    except requests.HTTPError as exc:  # an answer: its status says why (its text names the URL)
        click.echo(f"jobctl: management API refused the request ({_status(exc)})", err=True)
        sys.exit(EXIT_DEGRADED)
    except requests.RequestException as exc:  # no answer: its text names the API's host and port
        service_unreachable("management API", exc)
    for line in report or ["every queue already has the project's arguments"]:
        click.echo(line)


def _status(exc: requests.HTTPError) -> str:
    """``401 Client Error``, as requests words it, without the URL it appends."""
    response = exc.response
    if response is None:
        return type(exc).__name__
    kind = "Client" if response.status_code < 500 else "Server"
    return f"{response.status_code} {kind} Error: {response.reason}"
