"""Error reporting to Sentry (``SENTRY_DSN``), with personal data scrubbed from every event.

``sentry_sdk.init`` must run before the broker is built: the Dramatiq integration patches
``Broker.__init__`` to add its middleware. ``send_default_pii`` stays off, and ``before_send`` /
``before_breadcrumb`` run the project's scrubber over the whole event: exception values, frames'
local variables, extra, contexts, breadcrumbs, request data. Two things a pattern cannot catch are
removed outright: the job's arguments that the integration copies into ``contexts.dramatiq`` and
the local variables of Dramatiq's own frames (they hold the message and the raw body). Events are
tagged with the job's actor, queue and message id.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import sentry_sdk
import structlog
from sentry_sdk.integrations.dramatiq import DramatiqIntegration
from sentry_sdk.integrations.logging import ignore_logger
from sentry_sdk.types import Event, Hint

from actors.privacy import get_scrubber
from actors.settings import Settings
from middleware.lifecycle import DEFAULT_LOGGER as LIFECYCLE_LOGGER
from middleware.scrub import Scrubber

#: Parts of an event written by the SDK itself (versions, ids, timing): nothing of a person.
SDK_FIELDS = frozenset(
    {
        "event_id",
        "timestamp",
        "start_timestamp",
        "platform",
        "level",
        "sdk",
        "modules",
        "release",
        "environment",
        "server_name",
        "type",
        "transaction_info",
    }
)
#: Contexts written by the SDK: runtime and OS versions, trace ids.
SDK_CONTEXTS = frozenset({"runtime", "os", "trace", "device", "app"})
REMOVED = "[removed]"
#: Tags of a job's events, and the field of Dramatiq's message each comes from.
_TAGS = {"actor": "actor_name", "queue": "queue_name", "message_id": "message_id"}


def _frames(event: Event) -> Iterator[dict[str, Any]]:
    for part in ("exception", "threads"):
        container = event.get(part)
        values = container.get("values") if isinstance(container, dict) else None
        for value in values if isinstance(values, list) else ():
            stacktrace = value.get("stacktrace") if isinstance(value, dict) else None
            frames = stacktrace.get("frames") if isinstance(stacktrace, dict) else None
            yield from (f for f in frames or () if isinstance(f, dict))


def _job_tags(event: Event) -> dict[str, str]:
    """Actor, queue and message id from the integration's context or the bound log context."""
    data = event.get("contexts", {}).get("dramatiq", {}).get("data")
    if isinstance(data, dict):
        found = {key: data.get(name) for key, name in _TAGS.items()}
    else:
        bound = structlog.contextvars.get_contextvars()
        found = {key: bound.get(key) for key in _TAGS}
        found["message_id"] = found["message_id"] or event.get("extra", {}).get("dramatiq_message_id")
    return {key: str(value) for key, value in found.items() if value}


def scrub_event(scrubber: Scrubber, event: Event) -> Event | None:
    """``event`` tagged with its job and scrubbed; None (dropped) if that fails."""
    try:
        tags = event.get("tags")
        event["tags"] = {**(tags if isinstance(tags, dict) else {}), **_job_tags(event)}
        data = event.get("contexts", {}).get("dramatiq", {}).get("data")
        if isinstance(data, dict):
            data.update({key: REMOVED for key in ("args", "kwargs") if key in data})
        for frame in _frames(event):
            if str(frame.get("module") or "").startswith("dramatiq."):
                frame.pop("vars", None)
        scrubbed: dict[str, Any] = {}
        for key, value in event.items():
            if key in SDK_FIELDS:
                scrubbed[key] = value
            elif key == "contexts" and isinstance(value, dict):
                scrubbed[key] = {
                    name: ctx if name in SDK_CONTEXTS else scrubber(ctx) for name, ctx in value.items()
                }
            else:
                scrubbed[key] = scrubber(value)
        return scrubbed  # type: ignore[return-value]
    except Exception:  # an event we could not scrub is not sent
        return None


def configure_sentry(settings: Settings, scrubber: Scrubber | None = None) -> bool:
    """Start Sentry when ``SENTRY_DSN`` is set; returns whether it did."""
    if not settings.sentry_dsn:
        return False
    scrub = scrubber or get_scrubber(settings)

    def before_send(event: Event, hint: Hint) -> Event | None:
        return scrub_event(scrub, event)

    def before_breadcrumb(crumb: dict[str, Any], hint: Hint) -> dict[str, Any] | None:
        return scrub.mapping(crumb)

    sentry_sdk.init(
        dsn=settings.sentry_dsn,
        release=settings.sentry_release,
        environment=settings.sentry_environment,
        send_default_pii=False,
        integrations=[DramatiqIntegration()],
        before_send=before_send,
        before_breadcrumb=before_breadcrumb,
    )
    # Lifecycle lines about a failure repeat what the integration reports: no events from them.
    ignore_logger(LIFECYCLE_LOGGER)
    return True
