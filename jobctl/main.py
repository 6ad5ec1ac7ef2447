"""Entry point of ``jobctl``."""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import pika
import requests

from jobctl.dlq import dlq
from jobctl.migrate import migrate_queues
from jobctl.project import (
    EXIT_CONFIG,
    EXIT_DEGRADED,
    EXIT_OK,
    EXIT_UNREACHABLE,
    fail,
    import_application,
    import_modules,
    load_system,
    require_queues,
    store_unreachable,
)
from jobctl.worker_argv import dramatiq_argv, leading_modules, with_worker_queues
from jobsystem.runtime.connecting import open_connection
from jobsystem.urls import redact_url

if TYPE_CHECKING:
    from jobsystem.store.status_records import JobStatus


class Seconds(click.ParamType[float, Any]):
    """A timeout: a finite number of seconds above 0 and at most an hour (not 0, nan or inf)."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            seconds = math.nan
        if not (math.isfinite(seconds) and 0 < seconds <= 3600):
            self.fail("must be a number of seconds above 0 and at most 3600", param, ctx)
        return seconds


#: ``--timeout`` of the commands that talk to RabbitMQ.
timeout_option = click.option(
    "--timeout", type=Seconds(), default=5.0, show_default=True, help="Seconds to wait for each service."
)


class _Commands(click.Group):
    """jobctl's commands, where an unreachable RabbitMQ is one line and exit code 2, not a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except pika.exceptions.AMQPConnectionError as exc:
            fail(f"jobctl: RabbitMQ unreachable ({type(exc).__name__})")


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Operate the job system: run the worker, check the broker, inspect jobs and dead letters."""


main.add_command(dlq)
main.add_command(migrate_queues)


@main.command()
@timeout_option
def ping(timeout: float) -> None:
    """Check that RabbitMQ (AMQP and management API) answers.

    Exit code 0 when everything answers, 1 when only the management API does not, 2 when the broker
    cannot be reached.
    """
    from jobsystem.ops.management import call_api

    system = load_system()
    settings = system.settings
    parameters = system.broker.parameters
    parameters = parameters[0] if isinstance(parameters, list) else parameters
    parameters.socket_timeout = timeout
    parameters.stack_timeout = timeout  # the whole handshake, not pika's 15 s: --timeout holds
    parameters.connection_attempts = 1
    try:
        connection = open_connection(parameters)
        version = connection._impl.server_properties.get("version", b"?")
        connection.close()
    except pika.exceptions.AMQPError as exc:
        click.echo(f"rabbitmq    unreachable  {redact_url(settings.rabbitmq_url)}  ({type(exc).__name__})")
        sys.exit(EXIT_UNREACHABLE)
    server = version.decode() if isinstance(version, bytes) else str(version)
    click.echo(f"rabbitmq    ok           {redact_url(settings.rabbitmq_url)}  (RabbitMQ {server})")
    try:
        call_api(settings, "GET", settings.management_api("overview"), timeout)
    except requests.RequestException as exc:
        click.echo(f"management  unreachable  {redact_url(settings.management_url)}  ({type(exc).__name__})")
        sys.exit(EXIT_DEGRADED)
    click.echo(f"management  ok           {redact_url(settings.management_url)}")
    sys.exit(EXIT_OK)


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("dramatiq_args", nargs=-1, type=click.UNPROCESSED)
def worker(dramatiq_args: tuple[str, ...]) -> None:
    """Run `dramatiq actors` with processes, threads and shutdown timeout from settings.

    Extra arguments go to dramatiq: modules first, then options (--queues a b: QUEUE_PREFIX is
    added to a name as for every --queue of jobctl; a name that is neither an actor's queue nor
    one RabbitMQ has is refused).
    """
    system = load_system()
    settings = system.settings
    # The dramatiq of this environment (next to the interpreter): `.venv/bin/jobctl` works without
    # the venv on PATH, as `make run` calls it.
    beside = Path(sys.executable).parent / "dramatiq"
    executable = str(beside) if beside.is_file() else shutil.which("dramatiq") or "dramatiq"
    # A module that does not import or declares a bad rate_limit: one line here rather than a
    # traceback from every worker process. Its actors' queues are then known to --queues.
    import_modules("jobctl", leading_modules(dramatiq_args))
    argv = dramatiq_argv(executable, settings, with_worker_queues(system, dramatiq_args))
    # dramatiq keeps this PID, so its group's metrics directory is named after it. In a container
    # that is always 1: samples left by processes killed before a restart would count as live.
    from middleware.metrics import group_directory

    shutil.rmtree(group_directory(settings.prometheus_dir, os.getpid()), ignore_errors=True)
    os.execv(executable, argv)


@main.command(context_settings={"ignore_unknown_options": False})
@click.argument("modules", nargs=-1)
@click.option("--host", help="Address to listen on (default: DASHBOARD_HOST, 127.0.0.1).")
@click.option("--port", type=click.IntRange(1, 65_535), help="Port (default: DASHBOARD_PORT, 8181).")
def dashboard(modules: tuple[str, ...], host: str | None, port: int | None) -> None:
    """Serve the operators' web dashboard (log in as admin or viewer).

    MODULES: the application's modules that declare more actors, as for `jobctl worker`
    (their schedules, idempotency keys and queues are then known: only the project's queues are
    shown and acted on). Needs DASHBOARD_ADMIN_PASSWORD.
    """
    system = load_system()
    import_application("jobctl", modules)
    settings = system.settings
    if settings.dashboard_admin_password is None:
        # Fixed text, no data: straight to the terminal (the scrubbing stream would read
        # "PASSWORD: required" as a password and hide the word).
        click.echo(
            "jobctl: invalid setting DASHBOARD_ADMIN_PASSWORD: required to start the dashboard",
            file=sys.__stderr__,
        )
        sys.exit(EXIT_CONFIG)
    from dashboard.project import Project
    from dashboard.server import bind_listener, serve

    host, port = host or settings.dashboard_host, port or settings.dashboard_port
    try:  # bound once, here, and served on: no other process can take the port in between
        listener = bind_listener(host, port)
    except OSError as exc:  # a port in use: named here, not by uvicorn's log after the address
        fail(f"jobctl: cannot serve the dashboard on {host}:{port}: {exc.strerror or type(exc).__name__}")
    with listener:  # closed on every way out, serve's own included
        click.echo(f"dashboard on http://{host}:{port}/ (Ctrl-C stops it)", err=True)
        serve(Project.from_system(system), listener, host, port)


def _stamp(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")


def _when(ms: int | None, now_ms: int) -> str:
    if ms is None:
        return "-"
    if ms > now_ms:
        return f"{_stamp(ms)}  (in {(ms - now_ms) / 1000:.0f} s)"
    return f"{_stamp(ms)}  ({(now_ms - ms) / 1000:.0f} s ago)"


@main.command()
@click.argument("message_id")
@click.option("--json", "as_json", is_flag=True, help="Print the record as one JSON object.")
def status(message_id: str, as_json: bool) -> None:
    """Show the status of one job (the message id send() returned) or one workflow (the
    workflow_id of a pipeline or group): its steps and their members' states.

    Exit code 0 when the job is known, 1 when it is unknown or its record expired
    (JOB_STATUS_TTL_MS, RESULT_TTL_MS), 2 when the state store cannot be reached.
    """
    system = load_system()
    from jobsystem.ops.status import get_status, shown_status
    from jobsystem.store.base import StoreUnavailable
    from jobsystem.workflows import workflow_status

    try:
        record = get_status(message_id, state=system.store)
        flow = workflow_status(message_id, broker=system.broker) if record is None else None
    except StoreUnavailable as exc:
        store_unreachable(exc)
    if flow is not None:
        _print_workflow(flow, as_json)
        sys.exit(EXIT_OK)
    if record is None:
        click.echo(json.dumps({"message_id": message_id, "state": "unknown"}) if as_json else "unknown")
        sys.exit(EXIT_DEGRADED)
    # The result is kept as the actor returned it: scrubbed here as a structure, which the
    # scrubbing stdout, reading text line by line, cannot do.
    record = shown_status(record, system.scrubber)
    if as_json:
        click.echo(json.dumps(record.to_dict()))
        sys.exit(EXIT_OK)
    _print_job(record)
    sys.exit(EXIT_OK)


def _print_job(record: Any) -> None:
    now = int(time.time() * 1000)
    rows = [
        ("message", record.message_id),
        ("state", f"{record.state}  (attempt {record.attempts})" if record.attempts else record.state),
        ("actor", f"{record.actor or '-'}  on queue {record.queue or '-'}"),
        (
            "progress",
            "-" if record.progress is None else f"{record.progress:.0%}  {record.note or ''}".rstrip(),
        ),
        ("enqueued", _when(record.enqueued_at, now)),
        ("started", _when(record.started_at, now)),
        ("finished", _when(record.finished_at, now)),
    ]
    if record.retry_at and record.state == "retrying":
        rows.append(("next try", _when(record.retry_at, now)))
    if record.due_at and record.state == "scheduled":
        rows[1] = ("state", f"scheduled, due {_stamp(record.due_at)}")
        rows.append(("due", _when(record.due_at, now)))
    if record.error_type:
        rows.append(("error", f"{record.error_type}: {record.error or ''}"))
    if record.result is not None:
        rows.append(("result", json.dumps(record.result)))
    for name, value in rows:
        click.echo(f"{name:<10} {value}")


def _print_workflow(flow: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(flow))
        return
    click.echo(f"{'workflow':<10} {flow['workflow_id']}  ({flow['kind']})")
    click.echo(f"{'state':<10} {flow['state']}")
    failed = flow.get("failed_member")
    if failed:
        why = f"  ({failed['reason']})" if failed.get("reason") else ""
        click.echo(
            f"{'failed':<10} {failed['id']}  {failed.get('actor', '-')}  {failed.get('state') or ''}{why}"
        )
    for step in flow["steps"]:
        click.echo(f"step {step['step']}  ({step['mode']})")
        for member in step["members"]:
            click.echo(f"  {member['id']}  {member['actor']:<24} {member['state']}")


@main.command()
@click.argument("ids", nargs=-1, required=True)
def cancel(ids: tuple[str, ...]) -> None:
    """Cancel jobs (message ids) or workflows (every member not yet finished).

    A queued or delayed job is skipped when it arrives; a running one is interrupted within about
    a second (unless its actor is interruptible=False). Exit code 0 once marked, 2 when the state
    store cannot be reached.
    """
    system = load_system()
    from jobsystem.store.base import StoreUnavailable
    from jobsystem.workflows import cancel as cancel_ids
    from jobsystem.workflows import status_records
    from middleware.status import find_status

    status = find_status(system.broker)
    try:
        marked = cancel_ids(*ids, broker=system.broker)
        records = status_records(status, marked)
    except StoreUnavailable as exc:
        store_unreachable(exc)
    click.echo(f"cancelled {len(marked)} job(s)")
    if status is not None:
        _echo_cancel_caveats(marked, records)
    sys.exit(EXIT_OK)


def _echo_cancel_caveats(marked: list[str], records: Mapping[str, JobStatus]) -> None:
    """Say which marked ids will change nothing now: a mark on a job that already finished, or
    on an id with no status record (unknown here, or a job not recorded yet, which a mark still
    stops when it arrives), would otherwise read as a job stopped."""
    finished = sorted(i for i in marked if i in records and records[i].finished)
    unknown = sorted(i for i in marked if i not in records)
    if finished:
        states = ", ".join(f"{i} ({records[i].state})" for i in finished)
        click.echo(f"  already finished, nothing to stop: {states}")
    if unknown:
        click.echo(
            f"  no status record (unknown, or not recorded yet: skipped if it arrives): {', '.join(unknown)}"
        )


def _number(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


@main.command()
@click.option(
    "--queue",
    "queues",
    multiple=True,
    help="Check only this queue (repeatable; QUEUE_PREFIX is added, unless only the name as given exists).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@timeout_option
def health(queues: tuple[str, ...], as_json: bool, timeout: float) -> None:
    """Queue health: backlog, running, delayed, dead letters, consumers, rates, totals, verdicts.

    Checks the queues the project's actors declare (or those given with --queue) against the
    HEALTH_* thresholds. Exit code 0 healthy, 1 degraded (a state store that does not answer
    too), 2 broker unreachable or a --queue RabbitMQ does not have: usable as a container health
    check or a cron alert. RabbitMQ, its management API and the state store are asked at once;
    the check waits --timeout seconds at most in all, that of the --queue names included.
    """
    system = load_system()
    from jobsystem.ops.deadline import Deadline
    from jobsystem.ops.health import check
    from jobsystem.ops.queue_names import named_queues, resolve_queues

    settings, broker, deadline = system.settings, system.broker, Deadline(timeout)
    # A name given whole that RabbitMQ has is checked as given (read only): see queue_names.
    found = named_queues(settings, broker, queues, timeout, deadline)
    named = {queue: f"--queue {name!r}" for name, queue in found.items()}
    require_queues(settings, named, timeout, deadline)
    checked = sorted(named) if queues else resolve_queues(settings, broker)
    report = check(checked, config=settings, state=system.store, timeout=timeout, deadline=deadline)
    if as_json:
        click.echo(json.dumps(report.to_dict()))
        sys.exit(report.exit_code)
    if report.status == "unreachable":
        click.echo(f"unreachable  {report.error}")
        sys.exit(report.exit_code)
    header: tuple[str, ...] = ("queue", "verdict", "waiting", "running", "delayed", "scheduled")
    header += ("next due", "dead", "consumers", "publish/s", "ack/s", "oldest s", "succeeded", "failed")
    lines: list[tuple[str, ...]] = [header]
    for q in report.queues:
        lines.append(
            (
                q.queue,
                q.verdict,
                _number(q.waiting),
                _number(q.in_progress),
                _number(q.delayed),
                _number(q.scheduled),
                _stamp(q.next_due_at) if q.next_due_at else "-",
                _number(q.dead),
                _number(q.consumers),
                _number(q.publish_rate, 1),
                _number(q.ack_rate, 1),
                _number(q.oldest_age_s),
                _number(q.succeeded),
                _number(q.failed),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip())
    source = "management API" if report.source == "management" else "AMQP (management API unreachable)"
    click.echo(f"\n{report.status}  (numbers from {source}; succeeded/failed from the job-status counters)")
    for problem in report.problems:
        click.echo(f"  {problem.detail}")
    for q in report.queues:
        for problem in q.problems:
            click.echo(f"  {q.queue}: {problem.detail}")
    for note in report.notes:
        click.echo(f"  note: {note}")
    sys.exit(report.exit_code)
