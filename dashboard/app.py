"""The dashboard's ASGI application: pages, their JSON twins and actions, behind :mod:`dashboard.guard`.

Every page ``/x`` has a JSON endpoint ``/api/x`` with the same data, built by the same function
(:mod:`dashboard.queues`, :mod:`dashboard.jobs`, :mod:`dashboard.dead_letters`,
:mod:`dashboard.system`). Pages are rendered on the server; ``?fragment=1`` renders only the
page's content, which ``static/app.js`` fetches every few seconds to keep the page live.

Actions are ``POST /api/...`` with a JSON body, for admins only, checked against cross-site
requests (:mod:`dashboard.guard`, :mod:`dashboard.auth`), written to the audit log before they
run (an action whose entry cannot be written does not run) and completed there after.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pika.exceptions
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from dashboard import dead_letters, jobs, system
from dashboard.auth import Credentials, User
from dashboard.dead_letters import ActionError, Selection
from dashboard.format import register_filters
from dashboard.guard import Guard
from dashboard.project import (
    Project,
    ReadStopped,
    StoreUnavailable,
    cancel,
    release_thread_connection,
    store_outage,
    unreachable,
)
from dashboard.queues import HealthSampler, overview

__all__ = ["create_app"]

logger = logging.getLogger("dashboard")
HERE = Path(__file__).parent
NAV = [
    ("/", "Overview"),
    ("/jobs", "Jobs"),
    ("/dead-letters", "Dead letters"),
    ("/schedules", "Schedules"),
    ("/rate-limits", "Rate limits"),
    ("/workers", "Workers"),
    ("/audit", "Audit"),
]


#: What an action meets when RabbitMQ or the state store does not answer: an outage (503), not a bug.
OUTAGES = (ConnectionError, pika.exceptions.AMQPError, StoreUnavailable)


def _outage(exc: BaseException) -> str:
    """What the client is told of an outage: which service, whether it answered (a misconfigured
    store: which setting to check), the error's type (no address, no URL), and that part of the
    action may have been done (dead letters acked before the loss stay done)."""
    said = store_outage(exc) if isinstance(exc, StoreUnavailable) else unreachable("RabbitMQ", exc)
    return f"{said}: nothing done, or only part of it (see the dead letters page)"


def _text(request: Request, name: str) -> str | None:
    value = request.query_params.get(name, "").strip()
    return value or None


def _limit(request: Request) -> int:
    try:
        return int(request.query_params.get("limit", "50"))
    except ValueError:
        return 50


class Dashboard:
    """The routes' handlers, sharing the project, the sampler and the templates."""

    def __init__(self, project: Project, credentials: Credentials, sampler: HealthSampler) -> None:
        self.project = project
        self.credentials = credentials
        self.sampler = sampler
        self.templates = Environment(
            loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"])
        )
        register_filters(self.templates)

    # -- pages -----------------------------------------------------------------------------------

    def _respond(self, request: Request, template: str, build: Callable[[], dict[str, Any]]) -> Response:
        try:
            data = build()
        except StoreUnavailable as exc:  # unreachable or misconfigured: the page cannot be had (503)
            data, status = {"error": store_outage(exc)}, 503
        except ActionError as exc:
            data, status = {"error": str(exc)}, 400
        else:  # a page's own error (RabbitMQ unreachable is the overview's status: the page stands)
            status = 400 if data.get("error") and data.get("status") != "unreachable" else 200
        if data.pop("not_found", False):
            status = 404
        if request.url.path.startswith("/api/"):
            return JSONResponse(data, status_code=status)
        user: User = request.state.user
        html = self.templates.get_template(template).render(
            data=data,
            nav=NAV,
            path=request.url.path,
            user=user,
            csrf=self.credentials.csrf_token(user),
            fragment=request.query_params.get("fragment") == "1",
            query=dict(request.query_params),
        )
        return HTMLResponse(html, status_code=200 if status == 400 else status)

    def overview(self, request: Request) -> Response:
        return self._respond(request, "overview.html", lambda: overview(self.project, self.sampler))

    def jobs(self, request: Request) -> Response:
        def build() -> dict[str, Any]:
            data = jobs.job_list(
                self.project,
                queue=_text(request, "queue"),
                actor=_text(request, "actor"),
                state=_text(request, "state"),
                q=_text(request, "q"),
                before=_text(request, "before"),
                limit=_limit(request),
            )
            report = self.sampler.latest()[0]
            data["facets"] = {
                "queues": [h.queue for h in report.queues] if report else [],
                "actors": sorted(self.project.broker.actors),
                "states": jobs.STATES,
            }
            return data

        return self._respond(request, "jobs.html", build)

    def job(self, request: Request) -> Response:
        message_id = request.path_params["message_id"]

        def build() -> dict[str, Any]:
            found = jobs.job_detail(self.project, message_id, _text(request, "queue"))
            if found is None:
                return {"error": f"no job {message_id} (unknown or expired)", "not_found": True}
            return found

        return self._respond(request, "job.html", build)

    def dead_letters(self, request: Request) -> Response:
        return self._respond(
            request,
            "dead_letters.html",
            lambda: dead_letters.dead_letter_list(
                self.project,
                self.sampler.latest()[0],
                queue=_text(request, "queue"),
                actor=_text(request, "actor"),
                exception=_text(request, "exception"),
                since=_text(request, "since"),
                before=_text(request, "before"),
                limit=_limit(request),
            ),
        )

    def schedules(self, request: Request) -> Response:
        return self._respond(request, "schedules.html", lambda: system.schedules(self.project))

    def rate_limits(self, request: Request) -> Response:
        return self._respond(request, "rate_limits.html", lambda: system.rate_limits(self.project))

    def workers(self, request: Request) -> Response:
        return self._respond(request, "workers.html", lambda: system.workers(self.project))

    def audit(self, request: Request) -> Response:
        return self._respond(
            request,
            "audit.html",
            lambda: system.audit_list(self.project, _text(request, "before"), _limit(request)),
        )

    def csrf(self, request: Request) -> Response:
        user: User = request.state.user
        return JSONResponse({"token": self.credentials.csrf_token(user), "header": "X-CSRF-Token"})

    # -- actions ---------------------------------------------------------------------------------

    async def _act(
        self, request: Request, action: str, parse: Callable[[Any], Any], run: Callable[[Any], dict[str, Any]]
    ) -> Response:
        try:
            body = json.loads(await request.body() or b"{}")
            subject = await run_in_threadpool(parse, body)  # it may read the store: not on the loop
        except (ValueError, ActionError) as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        except StoreUnavailable as exc:
            return JSONResponse({"error": store_outage(exc, "nothing done")}, status_code=503)
        user: User = request.state.user
        entry = {
            "user": user.name,
            "action": action,
            "filter": subject.describe() if hasattr(subject, "describe") else subject,
            "client": request.client.host if request.client else None,
        }
        try:
            entry_id = await run_in_threadpool(self.project.audit.start, entry, int(time.time() * 1000))
        except StoreUnavailable as exc:  # its text names the store's host and port: at DEBUG only
            logger.error("dashboard_audit_unwritable", extra={"action": action, "error": type(exc).__name__})
            logger.debug("dashboard_audit_unwritable_cause", extra={"action": action, "error": str(exc)})
            error = f"audit log unwritable, nothing done ({type(exc).__name__})"
            return JSONResponse({"error": error}, status_code=503)
        started = time.monotonic()
        try:
            outcome = await run_in_threadpool(self._released, run, subject)
        except ActionError as exc:
            await self._audit_finish(entry_id, {"state": "refused", "error": str(exc)})
            return JSONResponse({"error": str(exc)}, status_code=400)
        except ReadStopped as exc:  # a re-index whose read stopped: its note says why, by class
            logger.warning("dashboard_action_stopped", extra={"action": action, "error": exc.error_class})
            failed = {"state": "failed", "error": exc.error_class, "note": exc.note}
            await self._audit_finish(entry_id, failed)
            return JSONResponse({"error": exc.note}, status_code=503)
        except OUTAGES as exc:
            logger.warning("dashboard_action_outage", extra={"action": action, "error": type(exc).__name__})
            await self._audit_finish(entry_id, {"state": "failed", "error": type(exc).__name__})
            return JSONResponse({"error": _outage(exc)}, status_code=503)
        except Exception as exc:
            logger.exception("dashboard_action_failed", extra={"action": action})
            await self._audit_finish(entry_id, {"state": "failed", "error": type(exc).__name__})
            return JSONResponse({"error": f"{action} failed ({type(exc).__name__})"}, status_code=500)
        counted = ("retried", "purged", "indexed", "cancelled")
        count = next((v for k, v in outcome.items() if k in counted), None)
        took_ms = int((time.monotonic() - started) * 1000)
        # Stopped before the end (a connection lost, the store down): what it did, and its note.
        state = "stopped" if outcome.get("stopped") else "done"
        finished = {"state": state, "count": count, "outcome": outcome, "took_ms": took_ms}
        await self._audit_finish(entry_id, finished)
        logger.info("dashboard_action", extra={"user": user.name, "action": action, "count": count})
        return JSONResponse(outcome)

    def _released(self, run: Callable[[Any], dict[str, Any]], subject: Any) -> dict[str, Any]:
        """``run(subject)`` on a request thread, then that thread's RabbitMQ connection closed
        (a replay declares its queue on it): anyio retires a pool thread after 10 s idle and
        starts new ones later, and each kept the connection it had opened, for as long as the
        dashboard ran. An action needing one again opens one (a handshake; actions are rare)."""
        try:
            return run(subject)
        finally:
            release_thread_connection(self.project.broker)

    async def _audit_finish(self, entry_id: Any, outcome: dict[str, Any]) -> None:
        """Note how an action ended; a store that fails now does not turn what was done (or
        refused) into an error for the client: the entry stays "started", and it is logged."""
        try:
            await run_in_threadpool(self.project.audit.finish, entry_id, outcome)
        except StoreUnavailable as exc:  # an ERROR is a Sentry event: the text (host, port) at DEBUG
            logger.error("dashboard_audit_unfinished", extra={"entry": entry_id, "error": type(exc).__name__})
            logger.debug("dashboard_audit_unfinished_cause", extra={"entry": entry_id, "error": str(exc)})

    async def retry_dead_letters(self, request: Request) -> Response:
        return await self._act(
            request,
            "dead_letters.retry",
            Selection.from_json,
            lambda s: dead_letters.retry(self.project, s),
        )

    async def purge_dead_letters(self, request: Request) -> Response:
        return await self._act(
            request,
            "dead_letters.purge",
            Selection.from_json,
            lambda s: dead_letters.purge(self.project, s),
        )

    async def reindex_dead_letters(self, request: Request) -> Response:
        def parse(body: Any) -> dict[str, Any]:
            if not isinstance(body, dict) or not isinstance(body.get("queue"), str) or not body["queue"]:
                raise ActionError('give the "queue" to re-index')
            return {"queue": body["queue"]}

        return await self._act(
            request,
            "dead_letters.reindex",
            parse,
            lambda s: dead_letters.reindex(self.project, s["queue"]),
        )

    async def retry_job(self, request: Request) -> Response:
        message_id = request.path_params["message_id"]

        def parse(body: Any) -> Selection:
            found = jobs.job_detail(
                self.project, message_id, body.get("queue") if isinstance(body, dict) else None
            )
            if found is None or not found["can_retry"]:
                raise ActionError(f"job {message_id} has no dead letter to retry")
            return Selection(queue=found["dead_letter"]["queue"], ids=(message_id,))

        return await self._act(request, "job.retry", parse, lambda s: dead_letters.retry(self.project, s))

    async def cancel_job(self, request: Request) -> Response:
        message_id = str(request.path_params["message_id"])

        def parse(body: Any) -> str:
            found = jobs.job_detail(self.project, message_id, None)
            if found is None or not found["can_cancel"]:
                raise ActionError(f"job {message_id} has finished: nothing to cancel")
            return message_id

        def run(target: str) -> dict[str, Any]:
            return {"cancelled": len(cancel(target, broker=self.project.system.broker))}

        return await self._act(request, "job.cancel", parse, run)


def create_app(project: Project, credentials: Credentials, sampler: HealthSampler) -> Starlette:
    """The dashboard for ``project``; ``sampler`` measures the queues (started by the caller)."""
    d = Dashboard(project, credentials, sampler)
    pages: list[tuple[str, Callable[[Request], Any], str]] = [
        ("/", d.overview, "queues"),
        ("/jobs", d.jobs, "jobs"),
        ("/jobs/{message_id:path}", d.job, "jobs/{message_id:path}"),
        ("/dead-letters", d.dead_letters, "dead-letters"),
        ("/schedules", d.schedules, "schedules"),
        ("/rate-limits", d.rate_limits, "rate-limits"),
        ("/workers", d.workers, "workers"),
        ("/audit", d.audit, "audit"),
    ]
    actions: list[tuple[str, Callable[[Request], Awaitable[Response]]]] = [
        ("/api/dead-letters/retry", d.retry_dead_letters),
        ("/api/dead-letters/purge", d.purge_dead_letters),
        ("/api/dead-letters/reindex", d.reindex_dead_letters),
        ("/api/jobs/{message_id:path}/retry", d.retry_job),
        ("/api/jobs/{message_id:path}/cancel", d.cancel_job),
    ]
    routes: list[Any] = [Route(path, endpoint, methods=["POST"]) for path, endpoint in actions]
    for path, endpoint, api in pages:
        routes += [Route(path, endpoint, methods=["GET"]), Route(f"/api/{api}", endpoint, methods=["GET"])]
    routes += [
        Route("/api/csrf", d.csrf, methods=["GET"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    return Starlette(routes=routes, middleware=[Middleware(Guard, credentials=credentials)])
