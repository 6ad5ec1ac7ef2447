"""How the pages show numbers, times, states and charts (Jinja filters)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

from jinja2 import Environment
from markupsafe import Markup

__all__ = ["register_filters"]

#: State and verdict colours, one palette for the whole dashboard (``static/app.css``).
TONES = {
    "succeeded": "ok",
    "healthy": "ok",
    "live": "ok",
    "done": "ok",
    "running": "busy",
    "started": "busy",
    "queued": "idle",
    "skipped": "idle",
    "cancelled": "idle",
    "stopped": "idle",
    "retrying": "warn",
    "failed": "warn",
    "degraded": "warn",
    "gone": "warn",
    "dead": "bad",
    "unreachable": "bad",
    "refused": "bad",
}


def tone(state: Any) -> str:
    return TONES.get(str(state), "idle")


def badge(state: Any) -> Markup:
    return Markup('<span class="badge {}">{}</span>').format(tone(state), state or "-")


def number(value: Any, digits: int = 0) -> str:
    """A number with thousands separators; "-" for anything else: a field a record lacks (an audit
    entry still running, or refused, has no count) reaches a template as Jinja's Undefined."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "-"
    return f"{value:,.{digits}f}"


def clock(ms: Any) -> str:
    """A time in UTC, to the second."""
    if not ms:
        return "-"
    return datetime.fromtimestamp(int(ms) / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def ago(ms: Any) -> str:
    """How long ago (or how far ahead) ``ms`` is, shortly."""
    if not ms:
        return "-"
    seconds = time.time() - int(ms) / 1000
    ahead = seconds < 0
    seconds = abs(seconds)
    for size, unit in ((86_400, "d"), (3_600, "h"), (60, "m")):
        if seconds >= size:
            text = f"{seconds / size:.0f}{unit}"
            break
    else:
        text = f"{seconds:.0f}s"
    return f"in {text}" if ahead else f"{text} ago"


def iso_ago(text: Any) -> str:
    if not text:
        return "-"
    try:
        return ago(datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return str(text)


def sparkline(points: dict[str, list[int]], width: int = 180, height: int = 28) -> Markup:
    """Succeeded (a filled area) and dead (bars) per minute, as inline SVG with a title."""
    succeeded, dead = points.get("succeeded", []), points.get("dead", [])
    slots = max(len(succeeded), len(dead), 1)
    top = max([*succeeded, *dead, 1])
    step = width / slots

    def y(value: int) -> float:
        return height - 1 - (height - 2) * value / top

    area = " ".join(f"{i * step:.1f},{y(v):.1f}" for i, v in enumerate(succeeded))
    bars = "".join(
        f'<rect class="dead" x="{i * step:.1f}" y="{y(v):.1f}" width="{max(step - 0.5, 1):.1f}" '
        f'height="{height - 1 - y(v):.1f}"/>'
        for i, v in enumerate(dead)
        if v
    )
    title = f"last hour: {sum(succeeded):,} succeeded, {sum(dead):,} failed for good; peak {top:,}/min"
    shape = f'<polyline class="ok" points="0,{height - 1} {area} {width},{height - 1}"/>' if area else ""
    return Markup(
        f'<svg class="spark" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img">'
        f"<title>{title}</title>{shape}{bars}</svg>"
    )


def segment(value: Any) -> str:
    """``value`` as one path segment: Jinja's ``urlencode`` leaves ``/`` as is, and a message id is
    the sender's text, so ``a/../../other`` would make a link or an action reach another job."""
    return quote(str(value), safe="")


def with_key(query: dict[str, str], key: str, value: str) -> str:
    """The page's query string with ``key`` set (and without the live-update flag)."""
    return urlencode({**{k: v for k, v in query.items() if k != "fragment"}, key: value})


def reject_key(query: dict[str, str], key: str) -> str:
    return urlencode({k: v for k, v in query.items() if k not in (key, "fragment")})


def register_filters(env: Environment) -> None:
    env.filters.update(
        badge=badge,
        tone=tone,
        number=number,
        clock=clock,
        ago=ago,
        iso_ago=iso_ago,
        sparkline=sparkline,
        with_key=with_key,
        reject_key=reject_key,
        segment=segment,
    )
