"""The guard around every request of the dashboard: log-in, roles, cross-site checks, and the
security headers on every answer.

Every path asks for basic auth (401 without it), a viewer's POST is refused (403), an admin's
POST must pass :func:`dashboard.auth.cross_site_refusal` (403), and every answer, refusals and
failures included, carries :data:`SECURITY_HEADERS`. A request that fails is answered 500 here,
logged with its path (no query string): Starlette's own 500 would go out without the headers.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from dashboard.auth import CSRF_HEADER, Credentials, User, cross_site_refusal

__all__ = ["SECURITY_HEADERS", "Guard"]

logger = logging.getLogger("dashboard")
#: On every answer: no framing, no sniffing, no caching, scripts and styles from the dashboard only.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


class Guard(BaseHTTPMiddleware):
    """Basic auth on every path (401), viewers read only (403), POSTs checked against forgery."""

    def __init__(self, app: Any, credentials: Credentials) -> None:
        super().__init__(app)
        self.credentials = credentials

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        """Every answer, refusals and failures included, carries :data:`SECURITY_HEADERS`: a 401 or
        403 page cached or framed is as much a page as any other."""
        response = await self._answer(request, call_next)
        response.headers.update(SECURITY_HEADERS)
        return response

    async def _answer(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        started = time.monotonic()
        header = request.headers.get("authorization")
        user = self.credentials.authenticate(header)
        if user is None:
            client = request.client.host if request.client else "-"
            if header and self.credentials.should_log_refusal(client):
                logger.warning("dashboard_login_refused", extra={"client": client})
            return Response(
                "log in to the dashboard\n",
                status_code=401,
                headers={"WWW-Authenticate": 'Basic realm="jobsystem dashboard", charset="UTF-8"'},
            )
        request.state.user = user
        if request.method not in ("GET", "HEAD"):
            refused = self._refusal(request, user)
            if refused is not None:
                logger.warning("dashboard_action_refused", extra={"user": user.name, "reason": refused})
                return JSONResponse({"error": refused}, status_code=403)
        try:
            response = await call_next(request)
        except Exception:  # Starlette's own 500 would go out without the headers
            logger.exception("dashboard_request_failed", extra={"path": request.url.path})
            response = Response("the dashboard failed to answer (see its log)\n", status_code=500)
        logger.debug(
            "dashboard_request",
            extra={
                "method": request.method,
                "path": request.url.path,
                "status": response.status_code,
                "user": user.name,
                "duration_ms": round((time.monotonic() - started) * 1000, 1),
            },
        )
        return response

    def _refusal(self, request: Request, user: User) -> str | None:
        if not user.can_act:
            return "read-only: the viewer cannot act"
        headers = request.headers
        return cross_site_refusal(
            host=headers.get("host", ""),
            content_type=headers.get("content-type"),
            origin=headers.get("origin"),
            referer=headers.get("referer"),
            fetch_site=headers.get("sec-fetch-site"),
            token_ok=self.credentials.token_matches(user, headers.get(CSRF_HEADER)),
        )
