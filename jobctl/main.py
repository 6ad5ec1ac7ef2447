"""Entry point of ``jobctl``."""

from __future__ import annotations

import os
import shutil
import sys

import click
import pika
import requests

from jobctl.dlq import dlq
from jobctl.project import EXIT_DEGRADED, EXIT_OK, EXIT_UNREACHABLE, load_actors


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Operate the job system: run the worker, check the broker, inspect jobs and dead letters."""


main.add_command(dlq)


@main.command("migrate-queues")
@click.option("--queue", "queues", multiple=True, help="Only this queue (repeatable); default: all of them.")
def migrate_queues(queues: tuple[str, ...]) -> None:
    """Recreate queues declared with other arguments (plain Dramatiq, an older configuration).

    Stop the workers first. Messages move to a temporary twin and back with confirms, and
    Dramatiq's old .XQ dead letters move into the project's .DLQ queues.
    """
    actors = load_actors()
    from actors.queue_migration import MigrationError, migrate

    try:
        report = migrate(actors.broker, actors.settings, list(queues) or None)
    except (MigrationError, requests.RequestException) as exc:
        click.echo(f"jobctl: {exc}", err=True)
        sys.exit(EXIT_DEGRADED)
    for line in report or ["every queue already has the project's arguments"]:
        click.echo(line)


@main.command()
@click.option("--timeout", default=5.0, show_default=True, help="Seconds to wait for each service.")
def ping(timeout: float) -> None:
    """Check that RabbitMQ (AMQP and management API) answers.

    Exit code 0 when everything answers, 1 when only the management API does not, 2 when the broker
    cannot be reached.
    """
    actors = load_actors()
    from actors.settings import redact_url

    settings = actors.settings
    parameters = actors.broker.parameters
    parameters = parameters[0] if isinstance(parameters, list) else parameters
    parameters.socket_timeout = timeout
    parameters.connection_attempts = 1
    try:
        connection = pika.BlockingConnection(parameters)
        version = connection._impl.server_properties.get("version", b"?")
        connection.close()
    except pika.exceptions.AMQPError as exc:
        click.echo(f"rabbitmq    unreachable  {redact_url(settings.rabbitmq_url)}  ({type(exc).__name__})")
        sys.exit(EXIT_UNREACHABLE)
    server = version.decode() if isinstance(version, bytes) else str(version)
    click.echo(f"rabbitmq    ok           {redact_url(settings.rabbitmq_url)}  (RabbitMQ {server})")
    try:
        response = requests.get(f"{settings.management_url}/api/overview", timeout=timeout)
        response.raise_for_status()
    except requests.RequestException as exc:
        click.echo(f"management  unreachable  {redact_url(settings.management_url)}  ({type(exc).__name__})")
        sys.exit(EXIT_DEGRADED)
    click.echo(f"management  ok           {redact_url(settings.management_url)}")
    sys.exit(EXIT_OK)


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("dramatiq_args", nargs=-1, type=click.UNPROCESSED)
def worker(dramatiq_args: tuple[str, ...]) -> None:
    """Run ``dramatiq actors`` with processes, threads and shutdown timeout from settings.

    Extra arguments go to dramatiq as they are (for example extra modules or ``--queues``).
    """
    settings = load_actors().settings
    executable = shutil.which("dramatiq") or "dramatiq"
    argv = [
        executable,
        "actors",
        *[a for a in dramatiq_args if not a.startswith("-")],
        "--processes",
        str(settings.worker_processes),
        "--threads",
        str(settings.worker_threads),
        "--worker-shutdown-timeout",
        str(settings.worker_shutdown_timeout_ms),
        *[a for a in dramatiq_args if a.startswith("-")],
    ]
    os.execv(executable, argv)
