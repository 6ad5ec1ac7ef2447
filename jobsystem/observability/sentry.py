"""Error reporting to Sentry (``SENTRY_DSN``), with personal data scrubbed from every event.

``sentry_sdk.init`` must run before the broker is built: the Dramatiq integration patches
``Broker.__init__`` to add its middleware. ``send_default_pii`` stays off, and ``before_send`` /
``before_breadcrumb`` run the project's scrubber over the whole event: exception values (every
exception of a chain or group), extra, contexts, breadcrumbs, request data. Events are tagged
with the job's actor (a registered actor's name, else ``unknown``), queue and message id.

Frames' local variables (the SDK sends them by default) follow one rule: **only the application's
own frames keep them** (``in_app``: the project's packages and code outside site-packages), and
there only numbers, booleans and None show as they are: every string (a job's argument in the
actor's own frame: a surname, which no pattern can tell from other words) becomes
``[text, N chars]``, a mapping ``[mapping, N items]`` (its keys are data too), a list is summed up
item by item. Library frames (Dramatiq's, smtplib's, pika's, requests') lose their locals: they
hold raw message bodies, protocol buffers and credentials. The job's arguments, which the
integration copies into ``contexts.dramatiq``, are removed outright, and so are those of the later
steps of a pipeline or workflow that its options carry. A request (the dashboard's) keeps its
method, its path and a few headers: not its query string (a search), its ``Referer`` (the previous
page's, search and all), cookies, body, host or client address.

What the SDK sends besides events is limited too (:func:`client_options`): no host name
(``server_name`` is ``SENTRY_SERVER_NAME`` or ``jobsystem``), no trace headers to other hosts,
only the integrations listed here (the auto-enabled ones would each add breadcrumbs of what a
deployment installs: Redis commands with their keys, SQL, URLs with their query strings), and the
trace headers a message carries lose the DSN's key (:mod:`jobsystem.observability.sentry_headers`).

The SDK's logging integration makes an event of every ERROR record and a breadcrumb of every INFO
one, with the record's message as text. A structlog record's message is its event dict, so that
text would be ``str(dict)``: a list or dict under a personal-data key (``address={...}``) sits in
brackets no key is next to, where no text scrub can tie it to its key. Such an event's ``logentry``
and breadcrumb's ``message`` are made again from the event dict scrubbed as a structure.
"""

from __future__ import annotations

import platform
import re
import sys
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import sentry_sdk
import structlog
from sentry_sdk.integrations import Integration
from sentry_sdk.integrations.argv import ArgvIntegration
from sentry_sdk.integrations.atexit import AtexitIntegration
from sentry_sdk.integrations.dedupe import DedupeIntegration
from sentry_sdk.integrations.dramatiq import DramatiqIntegration
from sentry_sdk.integrations.excepthook import ExcepthookIntegration
from sentry_sdk.integrations.logging import LoggingIntegration, ignore_logger
from sentry_sdk.integrations.modules import ModulesIntegration
from sentry_sdk.integrations.starlette import StarletteIntegration
from sentry_sdk.integrations.threading import ThreadingIntegration
from sentry_sdk.types import Event, Hint

from jobsystem.observability.sentry_headers import keep_dsn_out_of_messages
from jobsystem.privacy.message_arguments import carried_messages
from jobsystem.privacy.scrub import Scrubber
from jobsystem.privacy.setup import get_scrubber
from jobsystem.runtime.actor_names import actor_label
from jobsystem.runtime.cancellation import JobCancelled
from jobsystem.settings import Settings
from middleware.lifecycle import DEFAULT_LOGGER as LIFECYCLE_LOGGER

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
#: The project's packages: their frames are the application's own (``in_app``) wherever installed.
PROJECT_PACKAGES = ["jobsystem", "actors", "middleware", "scheduler", "jobctl", "demo"]
#: Tags of a job's events, and the field of Dramatiq's message each comes from.
_TAGS = {"actor": "actor_name", "queue": "queue_name", "message_id": "message_id"}
#: How the SDK writes a number, a boolean or None among a frame's locals (it ``repr``s them all).
_PLAIN = re.compile(r"[-+]?(\d+(\.\d*)?([eE][-+]?\d+)?|inf|nan)|None|True|False")
#: The request headers an event keeps: none names a person, a search or an address.
REQUEST_HEADERS = frozenset({"accept", "content-type", "content-length"})
#: ``server_name`` when ``SENTRY_SERVER_NAME`` is unset: the SDK's default is the host name.
UNNAMED_SERVER = "jobsystem"


def _frames(event: Event) -> Iterator[dict[str, Any]]:
    for part in ("exception", "threads"):
        container = event.get(part)
        values = container.get("values") if isinstance(container, dict) else None
        for value in values if isinstance(values, list) else ():
            stacktrace = value.get("stacktrace") if isinstance(value, dict) else None
            frames = stacktrace.get("frames") if isinstance(stacktrace, dict) else None
            yield from (f for f in frames or () if isinstance(f, dict))


def _job_tags(event: Event) -> dict[str, str]:
    """Actor, queue and message id from the integration's context or the bound log context. The
    actor is a registered one's name there (the integration sees only messages whose actor ran;
    ``JobLifecycle`` binds ``unknown`` for others); checked again as a name, it can be no other."""
    data = event.get("contexts", {}).get("dramatiq", {}).get("data")
    if isinstance(data, dict):
        found = {key: data.get(name) for key, name in _TAGS.items()}
    else:
        bound = structlog.contextvars.get_contextvars()
        found = {key: bound.get(key) for key in _TAGS}
        found["message_id"] = found["message_id"] or event.get("extra", {}).get("dramatiq_message_id")
    if found["actor"]:
        found["actor"] = actor_label(found["actor"])
    return {key: str(value) for key, value in found.items() if value}


def _brief(value: Any) -> Any:
    """A local variable's value summed up: a number, a boolean or None as it is; text by its
    length, a mapping by its size (its keys are a job's data as much as its values), a list item
    by item. A name cannot be told from other words, so no text is shown."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return value if _PLAIN.fullmatch(value) else f"[text, {len(value)} chars]"
    if isinstance(value, list):
        return [_brief(item) for item in value]
    if isinstance(value, dict):
        return f"[mapping, {len(value)} items]"
    return f"[{type(value).__name__}]"


def _scrub_locals(scrubber: Scrubber, frame: dict[str, Any]) -> None:
    """Drop a library frame's locals; scrub and brief an application frame's (module docstring):
    the variables' names are the code's, each value is summed up."""
    local_vars = frame.pop("vars", None)
    if frame.get("in_app") is True and isinstance(local_vars, dict):
        frame["vars"] = {name: _brief(value) for name, value in scrubber.mapping(local_vars).items()}


def _request(request: Any) -> dict[str, Any]:
    """A request as an event shows it: its method, its path and :data:`REQUEST_HEADERS`. Not its
    query string (a dashboard search), ``Referer`` (the previous page's URL, search and all),
    cookies, body, host (the dashboard's address) or client address."""
    if not isinstance(request, dict):
        return {}
    url, headers = request.get("url"), request.get("headers")
    kept: dict[str, Any] = {"method": request.get("method")}
    kept["url"] = urlsplit(url).path if isinstance(url, str) else None
    if isinstance(headers, dict):
        kept["headers"] = {k: v for k, v in headers.items() if str(k).lower() in REQUEST_HEADERS}
    if request.get("data") is not None:
        kept["data"] = REMOVED
    return {key: value for key, value in kept.items() if value is not None}


def _structlog_fields(hint: Hint | None) -> dict[str, Any] | None:
    """The event dict of the structlog record an event or breadcrumb was made from, else None."""
    record = hint.get("log_record") if isinstance(hint, dict) else None
    fields = getattr(record, "msg", None)
    return fields if isinstance(fields, dict) else None


def _log_text(scrubber: Scrubber, fields: dict[str, Any]) -> str:
    """A structlog event dict as the integration shows it (``str``), scrubbed as a structure first."""
    return str(scrubber.mapping(fields))


def scrub_breadcrumb(scrubber: Scrubber, crumb: dict[str, Any], hint: Hint | None = None) -> dict[str, Any]:
    """``crumb`` scrubbed; a structlog line's message made from its scrubbed event dict."""
    fields = _structlog_fields(hint)
    if fields is not None and "message" in crumb:
        crumb = {**crumb, "message": _log_text(scrubber, fields)}
    return scrubber.mapping(crumb)


def scrub_event(scrubber: Scrubber, event: Event, hint: Hint | None = None) -> Event | None:
    """``event`` tagged with its job and scrubbed; None (dropped) if that fails."""
    try:
        fields = _structlog_fields(hint)
        if fields is not None and isinstance(event.get("logentry"), dict):
            text = _log_text(scrubber, fields)
            event["logentry"] = {"message": text, "formatted": text, "params": []}
        tags = event.get("tags")
        event["tags"] = {**(tags if isinstance(tags, dict) else {}), **_job_tags(event)}
        dramatiq_context = event.get("contexts", {}).get("dramatiq", {})
        data = dramatiq_context.get("data")
        if isinstance(data, dict):  # the job's arguments, and those of the later steps it carries
            for message in carried_messages(data):
                message.update({key: REMOVED for key in ("args", "kwargs") if key in message})
        elif data is not None:  # the SDK's marker for a body over its size limit, or anything else
            dramatiq_context["data"] = REMOVED
        for frame in _frames(event):
            _scrub_locals(scrubber, frame)
        if "request" in event:
            event["request"] = _request(event["request"])
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


def client_options(settings: Settings, scrubber: Scrubber | None = None) -> dict[str, Any]:
    """The options of every Sentry client of the project: the scrubber over events and
    breadcrumbs, no personal data from the SDK, no host name, no trace headers to other hosts
    (their ``baggage`` would carry the DSN's key to any server an actor calls)."""
    scrub = scrubber or get_scrubber(settings)

    def before_send(event: Event, hint: Hint) -> Event | None:
        return scrub_event(scrub, event, hint)

    def before_breadcrumb(crumb: dict[str, Any], hint: Hint) -> dict[str, Any] | None:
        return scrub_breadcrumb(scrub, crumb, hint)

    return {
        "dsn": settings.sentry_dsn,
        "release": settings.sentry_release,
        "environment": settings.sentry_environment,
        "server_name": settings.sentry_server_name or UNNAMED_SERVER,
        "send_default_pii": False,
        "in_app_include": PROJECT_PACKAGES,
        "trace_propagation_targets": [],
        "before_send": before_send,
        "before_breadcrumb": before_breadcrumb,
    }


def integrations() -> list[Integration]:
    """The SDK's integrations a process runs: Dramatiq's, Starlette's (the dashboard) and the SDK's
    defaults but stdlib, whose breadcrumbs carry each outgoing request's URL, query string
    included, and each subprocess's command line. None is auto-enabled by what a deployment
    installs (Redis: a breadcrumb of each command with its key, such as a searched idempotency
    key; httpx, SQLAlchemy: URLs and queries). Listed whole, with the defaults off: the SDK's
    ``disabled_integrations`` misses one an earlier client of the process already set up."""
    defaults = [ArgvIntegration(), AtexitIntegration(), DedupeIntegration(), ExcepthookIntegration()]
    defaults += [LoggingIntegration(), ModulesIntegration(), ThreadingIntegration()]
    return [*defaults, DramatiqIntegration(), StarletteIntegration()]


def configure_sentry(settings: Settings, scrubber: Scrubber | None = None) -> bool:
    """Start Sentry when ``SENTRY_DSN`` is set, with :func:`integrations` only (the Python version
    the stdlib one added is added here); returns whether it did."""
    if not settings.sentry_dsn:
        return False
    sentry_sdk.init(
        **client_options(settings, scrubber),
        integrations=integrations(),
        default_integrations=False,
        ignore_errors=[JobCancelled],  # a cancelled job was stopped on purpose: no error event
    )
    runtime = {"name": platform.python_implementation(), "version": platform.python_version()}
    sentry_sdk.get_global_scope().set_context("runtime", {**runtime, "build": sys.version})
    keep_dsn_out_of_messages()
    # Lifecycle lines about a failure repeat what the integration reports: no events from them.
    ignore_logger(LIFECYCLE_LOGGER)
    return True
