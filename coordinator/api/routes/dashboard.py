"""The operator's dashboard: login, the page, and its live fragment (HTML rendered with Jinja2)."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fedprompt.coordinator.api.auth import is_admin_token
from fedprompt.coordinator.api.body import read_limited_body
from fedprompt.coordinator.api.deps import AdminDep, MetricsDep, ServiceDep, SettingsDep
from fedprompt.coordinator.api.jsonbody import BoundedJSONRoute
from fedprompt.coordinator.api.ratelimit_dep import UNGUESSABLE_CHARS, client_ip, get_rate_limiter
from fedprompt.coordinator.api.session import (
    CSRF_VALUE,
    SESSION_COOKIE,
    SESSION_TTL_S,
    has_session,
    new_session,
    parse_session,
)
from fedprompt.coordinator.dashboard import make_templates, page_data
from fedprompt.coordinator.errors import TooLarge
from fedprompt.coordinator.hosting.ratelimit import RateLimited

router = APIRouter(
    prefix="/dashboard", tags=["dashboard"], include_in_schema=False, route_class=BoundedJSONRoute
)
templates = make_templates()

# The page runs only its own scripts, is never framed (clickjacking of the action buttons) and is
# never cached (it shows live state behind a login).
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
LOGIN_BODY_LIMIT = 4096
POLL_MS = 1000


def _render(request: Request, name: str, context: dict[str, Any], status: int = 200) -> HTMLResponse:
    response = templates.TemplateResponse(request, name, context, status_code=status)
    response.headers.update(PAGE_HEADERS)
    return response


@router.get("", response_class=HTMLResponse)
def dashboard(
    request: Request,
    service: ServiceDep,
    settings: SettingsDep,
    metrics: MetricsDep,
    federation: int | None = None,
) -> Response:
    """The dashboard page; without a session, the login form."""
    if not has_session(request, settings, service):
        return RedirectResponse("/dashboard/login", status_code=303)
    data = page_data(service, metrics.refused_uploads, federation)
    return _render(request, "dashboard.html", {**data, "poll_ms": POLL_MS, "csrf_value": CSRF_VALUE})


@router.get("/live", response_class=HTMLResponse, dependencies=[AdminDep])
def live(
    request: Request, service: ServiceDep, metrics: MetricsDep, federation: int | None = None
) -> Response:
    """The page's live regions, re-rendered; the page swaps them in without reloading."""
    data = page_data(service, metrics.refused_uploads, federation)
    return _render(request, "live.html", data)


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, settings: SettingsDep, service: ServiceDep) -> Response:
    """The login form (the admin token is typed once, then kept as a session cookie)."""
    if has_session(request, settings, service):
        return RedirectResponse("/dashboard", status_code=303)
    return _render(request, "login.html", {"error": None})


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request, settings: SettingsDep) -> Response:
    """Check the token (constant time), set the HttpOnly session cookie, go to the dashboard."""
    try:
        body = await read_limited_body(request, LOGIN_BODY_LIMIT)
    except TooLarge:
        return _render(request, "login.html", {"error": "The request was too large."}, status=413)
    limiter, ip = get_rate_limiter(request), client_ip(request)
    token = (parse_qs(body.decode("utf-8", "replace")).get("token") or [""])[0].strip()
    try:
        if len(token) < UNGUESSABLE_CHARS:  # a token too long to guess is checked past the limit too
            limiter.check_failed_auth(ip)
    except RateLimited as exc:
        error = f"Too many failed logins from this address; try again in {exc.retry_after} s."
        page = _render(request, "login.html", {"error": error}, status=429)
        page.headers.update(exc.headers)
        return page
    ok = await run_in_threadpool(is_admin_token, token, settings)
    if not ok:
        limiter.record_failed_auth(ip)
        error = "That is not the admin token (FEDPROMPT_ADMIN_TOKEN) of this coordinator."
        return _render(request, "login.html", {"error": error}, status=401)
    response = RedirectResponse("/dashboard", status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        new_session(settings.admin_secret()),
        max_age=SESSION_TTL_S,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    response.headers.update(PAGE_HEADERS)
    return response


@router.post("/logout")
def logout(request: Request, settings: SettingsDep, service: ServiceDep) -> Response:
    """End the session: recorded as revoked in the database (no coordinator process accepts its cookie
    again, even one copied elsewhere), and the cookie forgotten in this browser."""
    session = parse_session(request.cookies.get(SESSION_COOKIE), settings.admin_secret())
    if session is not None:
        service.enrolment.revoke_session(*session)
    response = RedirectResponse("/dashboard/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
    return response
