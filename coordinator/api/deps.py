"""Dependencies shared by routes: the service, admin auth and client auth.

The admin authenticates with ``Authorization: Bearer <FEDPROMPT_ADMIN_TOKEN>`` (curl, the CLI) or
with the dashboard's session cookie. The cookie is not the token: it is an expiry and an HMAC of
it keyed by the admin token, so it works on every coordinator process sharing the token and dies
when the token is rotated. Requests that change state with the cookie must also send the header
``X-Requested-With: fedprompt-dashboard``, which a cross-site form cannot send (with the cookie's
SameSite=Strict, two independent guards against CSRF).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from typing import Annotated

from fastapi import Depends, Path, Request

from coordinator.config import Settings
from coordinator.db import MAX_ID, Client
from coordinator.errors import Forbidden, Invalid, TooLarge, Unauthorized
from coordinator.metrics import CoordinatorMetrics
from coordinator.service import Coordinator


def bearer(request: Request) -> str:
    """The bearer token of a request, or a 401 that says how to send one."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("missing bearer token: send the header 'Authorization: Bearer <token>'")
    return token.strip()


def get_service(request: Request) -> Coordinator:
    """The coordinator service of this app."""
    return request.app.state.service


def get_settings(request: Request) -> Settings:
    """The settings of this app."""
    return request.app.state.settings


def get_metrics(request: Request) -> CoordinatorMetrics:
    """The Prometheus metrics of this app."""
    return request.app.state.metrics


IdPath = Annotated[int, Path(ge=0, le=MAX_ID, description="A non-negative 32-bit id or number.")]
ServiceDep = Annotated[Coordinator, Depends(get_service)]
MetricsDep = Annotated[CoordinatorMetrics, Depends(get_metrics)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
TokenDep = Annotated[str, Depends(bearer)]


SESSION_COOKIE = "fedprompt_session"
SESSION_TTL_S = 12 * 3600
CSRF_HEADER = "x-requested-with"
CSRF_VALUE = "fedprompt-dashboard"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def is_admin_token(token: str, settings: Settings) -> bool:
    """Constant-time comparison with FEDPROMPT_ADMIN_TOKEN."""
    return hmac.compare_digest(token.encode(), settings.admin_secret().encode())


def _session_mac(admin_token: str, expires: int) -> str:
    return hmac.new(
        admin_token.encode(), f"fedprompt-dashboard|{expires}".encode(), hashlib.sha256
    ).hexdigest()


def new_session(admin_token: str, *, now: float | None = None, ttl: float = SESSION_TTL_S) -> str:
    """A dashboard session cookie value: expiry and its HMAC keyed by the admin token."""
    expires = int((time.time() if now is None else now) + ttl)
    return f"v1.{expires}.{_session_mac(admin_token, expires)}"


def session_is_valid(value: str | None, admin_token: str, *, now: float | None = None) -> bool:
    """True if the cookie value was made with this admin token and has not expired."""
    if not value:
        return False
    version, _, rest = value.partition(".")
    expires_s, _, mac = rest.partition(".")
    if version != "v1" or not expires_s.isdigit():
        return False
    expires = int(expires_s)
    if expires < (time.time() if now is None else now):
        return False
    return hmac.compare_digest(mac.encode(), _session_mac(admin_token, expires).encode())


def has_session(request: Request, settings: Settings) -> bool:
    """The request carries a valid dashboard session cookie."""
    return session_is_valid(request.cookies.get(SESSION_COOKIE), settings.admin_secret())


def require_admin(request: Request, settings: SettingsDep) -> None:
    """Admin routes: the bearer token must equal FEDPROMPT_ADMIN_TOKEN, or a dashboard session cookie."""
    if "authorization" not in request.headers and SESSION_COOKIE in request.cookies:
        if not has_session(request, settings):
            raise Unauthorized(
                "the dashboard session expired or is invalid; log in again at /dashboard/login"
            )
        if request.method not in SAFE_METHODS and request.headers.get(CSRF_HEADER) != CSRF_VALUE:
            raise Forbidden(
                f"requests that change state with the session cookie need the header "
                f"'X-Requested-With: {CSRF_VALUE}' (protection against cross-site requests)"
            )
        return
    if not is_admin_token(bearer(request), settings):
        raise Forbidden("this endpoint needs the admin token (FEDPROMPT_ADMIN_TOKEN)")


def require_client(fid: IdPath, token: TokenDep, service: ServiceDep, request: Request) -> Client:
    """Client routes: the token must belong to an active client of this federation."""
    client = service.authenticate_client(fid, token)
    request.state.client_id = client.id  # for the access log and per-client refusal counts
    return client


AdminDep = Depends(require_admin)
ClientDep = Annotated[Client, Depends(require_client)]


def require_admin_or_client(
    fid: IdPath, token: TokenDep, service: ServiceDep, settings: SettingsDep
) -> Client | None:
    """Routes both sides use: None for the admin, else the authenticated client."""
    if is_admin_token(token, settings):
        return None
    return service.authenticate_client(fid, token)


EitherDep = Annotated[Client | None, Depends(require_admin_or_client)]


async def read_limited_body(request: Request, limit: int) -> bytes:
    """Read a request body, refusing it (413) as soon as it exceeds `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise Invalid("invalid Content-Length header") from None
        if size > limit:
            raise TooLarge(f"body of {size} bytes exceeds the upload limit of {limit} bytes")
    chunks, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise TooLarge(f"body exceeds the upload limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
