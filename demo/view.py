"""The demo's live terminal view (rich): per-queue progress, rates, dead letters, the media job's
progress and what just happened. It only draws a :class:`Snapshot`; the demo fills it in."""

from __future__ import annotations

from dataclasses import dataclass, field

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text


@dataclass
class QueueRow:
    """One queue's line: jobs done of those expected, and what RabbitMQ holds right now."""

    name: str
    done: int = 0
    expected: int = 0
    waiting: int | None = None
    running: int | None = None
    delayed: int | None = None
    dead: int | None = None
    rate: float = 0.0
    note: str = ""


@dataclass
class MediaRow:
    """One media job's progress, as ``get_status`` reports it."""

    label: str
    state: str = "queued"
    progress: float = 0.0
    note: str = ""


@dataclass
class Snapshot:
    """Everything the view shows at one moment."""

    prefix: str
    elapsed_s: float = 0.0
    phase: str = "starting"
    processes: str = ""
    queues: list[QueueRow] = field(default_factory=list)
    media: list[MediaRow] = field(default_factory=list)
    figures: dict[str, str] = field(default_factory=dict)
    events: list[tuple[float, str]] = field(default_factory=list)


def _cell(value: int | None) -> str:
    return "-" if value is None else str(value)


def render(snapshot: Snapshot) -> RenderableType:
    """The whole view for ``snapshot``."""
    minutes, seconds = divmod(int(snapshot.elapsed_s), 60)
    header = Text.assemble(
        ("jobsystem demo", "bold"),
        f"  {minutes}:{seconds:02d}  ",
        (snapshot.phase, "cyan"),
        f"\nqueues and state keys under {snapshot.prefix!r}  {snapshot.processes}",
    )
    queues = Table(box=None, expand=False, padding=(0, 1))
    for column, justify in (
        ("queue", "left"),
        ("done", "left"),
        ("", "right"),
        ("waiting", "right"),
        ("running", "right"),
        ("delayed", "right"),
        ("dead", "right"),
        ("jobs/s", "right"),
        ("", "left"),
    ):
        queues.add_column(
            column,
            justify=justify,  # type: ignore[arg-type]
            no_wrap=True,
            min_width=max(len(column), 7),
        )
    for row in snapshot.queues:
        total = max(row.expected, row.done, 1)
        queues.add_row(
            row.name,
            ProgressBar(total=total, completed=row.done, width=22),
            f"{row.done}/{row.expected}",
            _cell(row.waiting),
            _cell(row.running),
            _cell(row.delayed),
            Text(_cell(row.dead), style="bold red" if row.dead else ""),
            f"{row.rate:.1f}",
            Text(row.note, style="dim"),
        )
    media = Table(box=None, padding=(0, 1), show_header=False)
    for item in snapshot.media:
        media.add_row(
            item.label,
            ProgressBar(total=1.0, completed=item.progress, width=30),
            f"{item.progress:4.0%}",
            item.state,
            Text(item.note, style="dim"),
        )
    figures = Text("  ·  ".join(f"{name} {value}" for name, value in snapshot.figures.items()))
    events = Text("\n".join(f"{at:5.1f}s  {what}" for at, what in snapshot.events[-6:]), style="dim")
    parts: list[RenderableType] = [header, Text(""), queues]
    if snapshot.media:
        parts += [Text("\nmedia pipeline (progress reported by the job, read with get_status)"), media]
    parts += [Text(""), figures, Text(""), events]
    return Panel(Group(*parts), expand=False)
