"""``jobctl dlq``: list, show, retry, purge and export dead letters."""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NoReturn

import click

from jobctl.project import EXIT_DEGRADED, fail, import_application, load_system, require_queues
from jobctl.whole_file import written_whole


def _since(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(
            "use an ISO date or time, e.g. 2026-11-29 or 2026-11-29T08:00", param_hint="'--since'"
        ) from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


#: How ``list`` shows, and ``--exception`` names, a dead letter without an exception.
NO_EXCEPTION = "-"


#: Which dead-letter queues a command takes: the project's, never every one on the vhost.
module_option = click.option(
    "--module",
    "modules",
    multiple=True,
    help="An application's module declaring more actors, as for `jobctl worker` (repeatable): their "
    "queues are the project's too. Without it: the project's actors' queues and those the "
    "dead-letter index knows.",
)


@dataclass(frozen=True)
class Selected:
    """The filters a subcommand was given (none: every dead letter of the project's queues), and
    the application's ``modules`` whose actors' queues are the project's too."""

    queue: str | None = None
    actor: str | None = None
    exception: str | None = None
    since: str | None = None
    modules: tuple[str, ...] = ()


def filter_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The filters every subcommand takes, handed to it as one ``selected``."""

    @functools.wraps(command)
    def with_filters(
        *args: Any,
        queue: str | None,
        actor: str | None,
        exception: str | None,
        since: str | None,
        modules: tuple[str, ...],
        **kwargs: Any,
    ) -> Any:
        return command(*args, selected=Selected(queue, actor, exception, since, modules), **kwargs)

    for option in reversed(
        [
            click.option("--queue", help="Only dead letters of this (original) queue."),
            click.option("--actor", help="Only dead letters of this actor."),
            click.option(
                "--exception",
                "exception",
                help=f"Only this exception type, e.g. TimeoutError; {NO_EXCEPTION} for those without one.",
            ),
            click.option("--since", help="Only those that failed at or after this ISO date/time (UTC)."),
            module_option,
        ]
    ):
        with_filters = option(with_filters)
    return with_filters


def replays_option(more: str = "") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--replays N``: only the dead letters whose job had been replayed N times (list, purge)."""
    return click.option(
        "--replays",
        type=click.IntRange(min=0),
        help="Only the dead letters whose job had been replayed this many times before it failed"
        f" (0: never; list and show say it){more}.",
    )


class Context:
    """The project and the filters of one command; ``reading`` (list, show, export) also takes a
    queue named by ``--queue`` that is none of the project's, if its ``.DLQ`` exists."""

    def __init__(self, ids: tuple[str, ...], selected: Selected, *, reading: bool = False) -> None:
        system = load_system()
        import_application("jobctl", selected.modules)
        from jobsystem.ops import dead_letters as ops
        from jobsystem.rabbitmq.broker import dead_letter_queue

        self.ops = ops
        self.broker = system.broker
        queue, named = selected.queue, f"--queue {selected.queue!r}"
        try:  # only the project's queues, never another application's on the vhost
            self.queues, unread = ops.dead_letter_scope(
                system.settings, system.broker, queue, reading=reading
            )
        except ops.ForeignQueue as exc:
            require_queues(system.settings, {dead_letter_queue(exc.name): named})  # a typo first
            fail(
                f"jobctl: {named}: {exc} (an application's actors: name their --module; a removed"
                " actor's: re-index its queue on the dashboard)"
            )
        if queue is not None:  # a typo: say so, rather than "0 dead letters" or a channel error
            require_queues(system.settings, {name: named for name in self.queues})
        self.complete = not unread
        if unread:  # a removed actor's letters may be left out: never "all of them"
            click.echo(f"jobctl: {unread}: only the dead letters of the actors' queues", err=True)
        self.filters = ops.Filters(
            message_ids=frozenset(ids),
            queue=None,
            actor=selected.actor,
            exception="" if selected.exception == NO_EXCEPTION else selected.exception,
            since=_since(selected.since),
        )

    @contextmanager
    def progress(self, label: str) -> Iterator[Callable[[int], None]]:
        """A progress bar on stderr over every dead letter scanned (hidden when not a terminal)."""
        length = self.ops.total(self.broker, self.queues)
        with click.progressbar(length=length, label=label, file=sys.stderr) as bar:
            yield bar.update


@contextmanager
def stopping(ctx: Context, said: Callable[[], str]) -> Iterator[None]:
    """A read (list, show, export) that stops midway (its connection lost) ends with ``said()``,
    what it did, and the note why (the error named by its class) on stderr, and exit 1: never
    with a traceback. It removed nothing: the letters it read stay dead letters."""
    try:
        yield
    except ctx.ops.ReadStopped as exc:
        click.echo(f"{said()} ({exc.note})", err=True)
        sys.exit(EXIT_DEGRADED)


@click.group()
def dlq() -> None:
    """Dead letters: every message that failed for good, with its final error."""


@dlq.command("list")
@filter_options
@replays_option()
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line.")
def list_(selected: Selected, replays: int | None, as_json: bool) -> None:
    """List dead letters (streamed: fine for 100k)."""
    ctx = Context((), selected, reading=True)
    filters = dataclasses.replace(ctx.filters, replays=replays)
    count = 0

    def listed() -> str:
        return f"{count} dead letter(s) in {len(ctx.queues)} queue(s)"

    with stopping(ctx, lambda: f"{listed()} so far"):
        for dead in ctx.ops.read(ctx.broker, ctx.queues, filters):
            count += 1
            if as_json:
                click.echo(ctx.ops.to_json_line(dead.summary()))
            else:
                failed = dead.failed_at.strftime("%Y-%m-%d %H:%M:%S") if dead.failed_at else "?"
                click.echo(
                    f"{dead.message_id}  {failed}  {dead.queue}  {dead.actor or '-'}  {dead.reason}  "
                    f"{dead.exception or NO_EXCEPTION}  attempts={dead.attempts}  "
                    f"replays={_count(dead.replays)}  {dead.error[:80]}"
                )
    click.echo(listed(), err=True)
    sys.exit(0 if ctx.complete else EXIT_DEGRADED)


def _count(value: int | None) -> str:
    """A count as the terminal shows it; one not known (a body that is not a message) as ``-``."""
    return "-" if value is None else str(value)


def body_view(body: bytes) -> dict[str, Any] | str:
    """A body as the terminal shows it: the message (and each later step of a workflow or
    pipeline its options carry) with its positional arguments counted, not shown (a name among
    them cannot be told from other words), its keyword arguments scrubbed as a structure (a dict
    or list under ``address`` goes whole; the scrubbing output stream, which sees text line by
    line, takes care of the rest) and its idempotency key hidden; or only the size of a body that
    is not a message."""
    from dramatiq import Message
    from dramatiq.errors import DecodeError

    from jobsystem.privacy.message_arguments import carried_messages
    from jobsystem.system import get_system

    try:
        message = Message.decode(body)
    except DecodeError:
        return f"({len(body)} bytes, not a message: not shown; `jobctl dlq export -o FILE` has it)"
    data: dict[str, Any] = message.asdict()
    scrubber = get_system().scrubber
    for carried in carried_messages(data):  # the job, and the later steps its options carry
        _hide_arguments(carried, scrubber)
    return data


def _hide_arguments(message: dict[str, Any], scrub: Callable[[Any], Any]) -> None:
    """A message's fields, in place, with its arguments and idempotency key hidden: they are the
    job's data, whatever their shape in a malformed body."""
    args, kwargs, options = message.get("args"), message.get("kwargs"), message.get("options")
    message["args"] = (
        f"<{len(args)} positional, hidden>" if isinstance(args, list | tuple) else "<not an array, hidden>"
    )
    message["kwargs"] = scrub(dict(kwargs)) if isinstance(kwargs, dict) else "<not an object, hidden>"
    if isinstance(options, dict) and options.get("idempotency_key") is not None:
        message["options"] = {**options, "idempotency_key": "<hidden>"}


def _shown(body: bytes) -> str:
    view = body_view(body)
    return view if isinstance(view, str) else json.dumps(view, ensure_ascii=False, indent=2, default=str)


@dlq.command()
@click.argument("message_id")
@click.option("--queue", help="Look only in this (original) queue's dead letters.")
@module_option
def show(message_id: str, queue: str | None, modules: tuple[str, ...]) -> None:
    """Show one dead letter: record, traceback and body, scrubbed of personal data.

    Positional arguments are counted, not shown; `jobctl dlq export -o FILE` writes bodies whole.
    """
    ctx = Context((message_id,), Selected(queue=queue, modules=modules), reading=True)
    with stopping(ctx, lambda: f"dead letter {message_id} not found so far"):
        for dead in ctx.ops.read(ctx.broker, ctx.queues, ctx.filters):
            data = dead.summary()
            width = max(len(k) for k in data)
            data["replays"] = _count(dead.replays)
            for key, value in data.items():
                click.echo(f"{key:<{width}}  {value}")
            click.echo(f"\nbody\n{_shown(dead.body)}\n\ntraceback\n{dead.traceback or '(none)'}")
            return
    click.echo(f"no dead letter {message_id}", err=True)
    sys.exit(1)


def _selection(ids: tuple[str, ...], all_: bool) -> None:
    if bool(ids) == all_:
        raise click.UsageError("give message ids, or --all (with optional filters)")


@dlq.command()
@click.argument("message_ids", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Every dead letter that matches the filters.")
@filter_options
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=500,
    show_default=True,
    help="Messages published per confirmed batch.",
)
def retry(message_ids: tuple[str, ...], all_: bool, selected: Selected, batch_size: int) -> None:
    """Publish dead letters back to their queue (attempts reset, same id and key), then remove them."""
    _selection(message_ids, all_)
    ctx = Context(message_ids, selected)
    with ctx.progress("retrying") as progress:
        outcome = ctx.ops.replay(
            ctx.broker, ctx.queues, ctx.filters, batch_size=batch_size, progress=progress
        )
    click.echo(
        f"retried {outcome.done} of {outcome.matched} matching{_so_far(outcome)},"
        f" {outcome.failed} failed{_notes(outcome)}"
    )
    if outcome.unremoved:  # every one (the note names a few): purge, never retry, these
        click.echo(f"replayed, maybe still dead letters: {' '.join(outcome.unremoved)}", err=True)
        for command in outcome.purges():  # these letters only, not a newer one of the same job
            click.echo(f"purge them with: {command}", err=True)
    _exit(
        outcome,
        message_ids,
        outcome.failed or outcome.unconfirmed or outcome.left or (all_ and not ctx.complete),
    )


def _notes(outcome: Any) -> str:
    return f" ({'; '.join(outcome.notes)})" if outcome.notes else ""


def _so_far(outcome: Any) -> str:
    """Of an operation that stopped before reading every letter: its counts are what it read."""
    return " so far" if outcome.stopped else ""


@dlq.command()
@click.argument("message_ids", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Every dead letter that matches the filters.")
@filter_options
@replays_option(
    ", as the purge a stopped retry names: a newer dead letter of the same job (its replay failed"
    " again) is left"
)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def purge(
    message_ids: tuple[str, ...], all_: bool, selected: Selected, replays: int | None, yes: bool
) -> None:
    """Delete dead letters for good."""
    _selection(message_ids, all_)
    if not yes and not click.confirm("Delete the matching dead letters for good?", err=True):
        raise click.UsageError("not confirmed: pass --yes to purge without a prompt")
    ctx = Context(message_ids, selected)
    filters = dataclasses.replace(ctx.filters, replays=replays)
    with ctx.progress("purging") as progress:
        outcome = ctx.ops.purge(ctx.broker, ctx.queues, filters, progress=progress)
    click.echo(f"purged {outcome.done} dead letter(s){_so_far(outcome)}{_notes(outcome)}")
    _exit(outcome, message_ids, outcome.unconfirmed or outcome.left or (all_ and not ctx.complete))


def _exit(outcome: Any, message_ids: tuple[str, ...], failed: Any) -> NoReturn:
    """Exit 1 when anything failed or stopped the operation, or an id given matched no letter
    (named even when something else failed; not when it stopped: ids not read yet are unknown)."""
    missing = not outcome.stopped and _not_found(message_ids, outcome.found)
    sys.exit(1 if failed or outcome.stopped or missing else 0)


def _not_found(message_ids: tuple[str, ...], found: set[str]) -> bool:
    """Name the ids given that matched no dead letter (a typo, or one already retried or purged)."""
    missing = [m for m in dict.fromkeys(message_ids) if m not in found]
    if missing:
        click.echo(f"no dead letter {', '.join(missing)}", err=True)
    return bool(missing)


@dlq.command()
@filter_options
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, writable=True, allow_dash=True),
    default="-",
    help="File to write (default stdout), whole or not at all (a new one owner-only: it holds bodies).",
)
def export(selected: Selected, output: str) -> None:
    """Write dead letters as JSON lines (record, traceback, body), for audit; removes nothing.

    Bodies are the jobs' own data, personal data included: written whole to a file (-o), scrubbed
    when written to the terminal. An export that stops midway leaves no file (an earlier one stays).
    """
    ctx = Context((), selected, reading=True)
    terminal = output == "-"
    count = 0
    with ExitStack() as stack:
        try:
            out = sys.stdout if terminal else stack.enter_context(written_whole(output))
        except OSError as exc:
            fail(f"jobctl: --output {output!r}: cannot write there ({exc.strerror or type(exc).__name__})")
        said = "so far" if terminal else f"so far, {output} not written"
        with stopping(ctx, lambda: f"exported {count} dead letter(s) {said}"):
            for dead in ctx.ops.read(ctx.broker, ctx.queues, ctx.filters):
                data = dead.full()
                if terminal:  # through the scrubbing stream, the body as `show` has it, not whole in base64
                    data["body"] = body_view(dead.body)
                    data.pop("body_base64", None)
                out.write(ctx.ops.to_json_line(data) + "\n")
                count += 1
    click.echo(f"exported {count} dead letter(s)", err=True)
    sys.exit(0 if ctx.complete else EXIT_DEGRADED)
