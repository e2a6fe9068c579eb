"""Dependencies shared by routes: the service, and the one authorisation check (`authorize`).

Every route that needs a token depends on exactly one of `require_admin`, `require_client`,
`require_admin_or_client` or `require_enrolment`; each is a thin wrapper of `authorize` for its
scope (tests/coordinator/test_security.py walks the routes to hold this). Failed authentications
and enrolments are rate-limited per IP (coordinator/ratelimit.py).

The admin authenticates with ``Authorization: Bearer <FEDPROMPT_ADMIN_TOKEN>`` (curl, the CLI) or
with the dashboard's session cookie. The cookie is not the token: it is an expiry, a random session
id and an HMAC of both keyed by the admin token, so it works on every coordinator process sharing
the token and dies when the token is rotated; its logout records the session id in the database
(revoked_sessions), and every process refuses it from then on. Requests that change state with the cookie must also send the header
``X-Requested-With: fedprompt-dashboard``, which a cross-site form cannot send (with the cookie's
SameSite=Strict, two independent guards against CSRF).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from enum import StrEnum
from typing import Annotated, Any

from fastapi import Depends, Path, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from coordinator.config import Settings
from coordinator.db import MAX_ID, Client
from coordinator.errors import Forbidden, Invalid, TooLarge, Unauthorized
from coordinator.inflight import Ticket
from coordinator.metrics import CoordinatorMetrics
from coordinator.ratelimit import RateLimiter
from coordinator.service import Coordinator


def _bearer_token(request: Request) -> str:
    """The bearer token of a request, or '' if it sends none."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def bearer(request: Request) -> str:
    """The bearer token of a request, or a 401 that says how to send one."""
    token = _bearer_token(request)
    if not token:
        raise Unauthorized("missing bearer token: send the header 'Authorization: Bearer <token>'")
    return token


# Dependencies that do no I/O are `async def`: FastAPI runs a plain `def` dependency in the request
# thread pool, one hop (and a queue behind every busy thread) per dependency per request.


async def get_service(request: Request) -> Coordinator:
    """The coordinator service of this app."""
    return request.app.state.service


async def get_settings(request: Request) -> Settings:
    """The settings of this app."""
    return request.app.state.settings


async def get_metrics(request: Request) -> CoordinatorMetrics:
    """The Prometheus metrics of this app."""
    return request.app.state.metrics


IdPath = Annotated[int, Path(ge=0, le=MAX_ID, description="A non-negative 32-bit id or number.")]
# A prompt version as a path or query parameter: a number (ASCII digits) or 'latest'.
VERSION_PATTERN = r"^(?:latest|[0-9]{1,10})$"
VersionPath = Annotated[str, Path(pattern=VERSION_PATTERN, description="A version number or 'latest'.")]
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


_SESSION = re.compile(r"v1\.([0-9]{1,12})\.([A-Za-z0-9_-]{16,64})\.([0-9a-f]{64})")


def _session_mac(admin_token: str, expires: int, session_id: str) -> str:
    return hmac.new(
        admin_token.encode(), f"fedprompt-dashboard|{expires}|{session_id}".encode(), hashlib.sha256
    ).hexdigest()


def new_session(admin_token: str, *, now: float | None = None, ttl: float = SESSION_TTL_S) -> str:
    """A dashboard session cookie value: expiry, a random session id and their HMAC keyed by the admin token."""
    expires = int((time.time() if now is None else now) + ttl)
    session_id = secrets.token_urlsafe(16)
    return f"v1.{expires}.{session_id}.{_session_mac(admin_token, expires, session_id)}"


def parse_session(value: str | None, admin_token: str, *, now: float | None = None) -> tuple[str, int] | None:
    """(session id, expiry) of a cookie value made with this admin token and not expired, else None."""
    match = _SESSION.fullmatch(value or "")
    if match is None:
        return None
    expires, session_id, mac = int(match[1]), match[2], match[3]
    if expires < (time.time() if now is None else now):
        return None
    if not hmac.compare_digest(mac.encode(), _session_mac(admin_token, expires, session_id).encode()):
        return None
    return session_id, expires


def session_is_valid(value: str | None, admin_token: str, *, now: float | None = None) -> bool:
    """True if the cookie value was made with this admin token and has not expired (no I/O: whether
    its logout revoked it is `has_session`'s question)."""
    return parse_session(value, admin_token, now=now) is not None


def has_session(request: Request, settings: Settings, service: Coordinator) -> bool:
    """The request carries a valid dashboard session cookie whose session was not logged out (reads
    the database: call it from a thread)."""
    parsed = parse_session(request.cookies.get(SESSION_COOKIE), settings.admin_secret())
    return parsed is not None and not service.session_revoked(parsed[0])


def uses_session(request: Request) -> bool:
    """The request authenticates with the dashboard's cookie (it sends no Authorization header)."""
    return "authorization" not in request.headers and SESSION_COOKIE in request.cookies


class WrongAdminToken(Forbidden):
    """A token was sent to an admin route and it is not the admin token (counts as a failed login)."""


def client_ip(request: Request) -> str:
    """The address rate limits are keyed by (uvicorn resolves X-Forwarded-For only from the proxies
    in FEDPROMPT_TRUSTED_PROXIES; none by default)."""
    return request.client.host if request.client else "unknown"


def get_rate_limiter(request: Request) -> RateLimiter:
    """The per-IP rate limiter of this app."""
    return request.app.state.rate_limiter


@contextmanager
def counting_failures(request: Request, *, count: bool = True) -> Iterator[None]:
    """Refuse (429) an address over its failed-authentication limit; count this request's failure."""
    limiter, ip = get_rate_limiter(request), client_ip(request)
    limiter.check_failed_auth(ip)
    try:
        yield
    except (Unauthorized, WrongAdminToken):
        if count:
            limiter.record_failed_auth(ip)
        raise


class Scope(StrEnum):
    """Who may call a route: the single authorisation check of every non-public route."""

    ADMIN = "admin"
    CLIENT = "client"
    ADMIN_OR_CLIENT = "admin-or-client"
    ENROLMENT = "enrolment"


def authorize(
    request: Request,
    scope: Scope,
    settings: Settings,
    service: Coordinator | None = None,
    fid: int | None = None,
) -> Client | None:
    """Check the caller against a scope: None for the admin, the Client for a client token.

    Admin: the bearer token equals FEDPROMPT_ADMIN_TOKEN (constant-time), or a dashboard session
    cookie (then state-changing methods also need the CSRF header). Client: the token's sha256
    names an active client of federation `fid`; a client only ever acts as that client.
    """
    request.state.auth_scope = scope
    if scope is Scope.ADMIN and uses_session(request):
        assert service is not None
        with counting_failures(request, count=False):  # a stale cookie is not a guess
            if not has_session(request, settings, service):
                raise Unauthorized(
                    "the dashboard session expired or is invalid; log in again at /dashboard/login"
                )
        if request.method not in SAFE_METHODS and request.headers.get(CSRF_HEADER) != CSRF_VALUE:
            raise Forbidden(
                f"requests that change state with the session cookie need the header "
                f"'X-Requested-With: {CSRF_VALUE}' (protection against cross-site requests)"
            )
        return None
    with counting_failures(request):
        token = bearer(request)
        if scope is Scope.ADMIN:
            if not is_admin_token(token, settings):
                raise WrongAdminToken("this endpoint needs the admin token (FEDPROMPT_ADMIN_TOKEN)")
            return None
        if scope is Scope.ADMIN_OR_CLIENT and is_admin_token(token, settings):
            return None
        assert service is not None and fid is not None
        client = service.authenticate_client(fid, token)
    request.state.client_id = client.id  # for the access log and per-client refusal counts
    return client


# OpenAPI security schemes: they document which token each route takes (and give /docs its
# "Authorize" button); the checking is `authorize`'s, which answers problem+json.
admin_scheme = HTTPBearer(
    scheme_name="admin",
    description="FEDPROMPT_ADMIN_TOKEN (the dashboard's session cookie also works).",
    auto_error=False,
)
client_scheme = HTTPBearer(
    scheme_name="client", description="The client token returned by enrolment.", auto_error=False
)
enrolment_scheme = HTTPBearer(
    scheme_name="enrolment",
    description="An enrolment token issued by the operator (POST .../enrollment-tokens).",
    auto_error=False,
)
Credentials = HTTPAuthorizationCredentials | None


async def _authorize_client(
    request: Request, scope: Scope, settings: Settings, service: Coordinator, fid: int
) -> Client | None:
    """`authorize` on the event loop when it needs no database (an admin token, a client token in the
    service's authentication cache), else in a thread. An entry that expires between the two checks
    costs one lookup on the loop."""
    token = _bearer_token(request)
    if service.cached_client(token) is not None or (
        scope is Scope.ADMIN_OR_CLIENT and is_admin_token(token, settings)
    ):
        return authorize(request, scope, settings, service, fid)
    return await run_in_threadpool(authorize, request, scope, settings, service, fid)


async def require_admin(
    request: Request,
    settings: SettingsDep,
    service: ServiceDep,
    _: Annotated[Credentials, Depends(admin_scheme)],
) -> None:
    """Admin routes (the session cookie's check reads the database: in a thread)."""
    if uses_session(request):
        await run_in_threadpool(authorize, request, Scope.ADMIN, settings, service)
    else:
        authorize(request, Scope.ADMIN, settings)


async def require_client(
    request: Request,
    fid: IdPath,
    service: ServiceDep,
    settings: SettingsDep,
    _: Annotated[Credentials, Depends(client_scheme)],
) -> Client:
    """Client routes: the token must belong to an active client of this federation."""
    client = await _authorize_client(request, Scope.CLIENT, settings, service, fid)
    assert client is not None
    return client


async def require_admin_or_client(
    request: Request,
    fid: IdPath,
    service: ServiceDep,
    settings: SettingsDep,
    _a: Annotated[Credentials, Depends(admin_scheme)],
    _c: Annotated[Credentials, Depends(client_scheme)],
) -> Client | None:
    """Routes both sides use: None for the admin, else the authenticated client."""
    return await _authorize_client(request, Scope.ADMIN_OR_CLIENT, settings, service, fid)


async def require_enrolment(
    request: Request, fid: IdPath, _: Annotated[Credentials, Depends(enrolment_scheme)]
) -> AsyncIterator[str]:
    """The enrolment route: rate-limited per IP; the token itself is checked by the enrolment.

    A refused enrolment token (unknown, expired, used up) counts as a failed authentication.
    """
    del fid  # part of the route; the service checks the token against it
    request.state.auth_scope = Scope.ENROLMENT
    with counting_failures(request):
        get_rate_limiter(request).hit_enrolment(client_ip(request))
        yield bearer(request)


AdminDep = Depends(require_admin)
ClientDep = Annotated[Client, Depends(require_client)]
EitherDep = Annotated[Client | None, Depends(require_admin_or_client)]
EnrolmentDep = Annotated[str, Depends(require_enrolment)]
AUTH_DEPENDENCIES = (require_admin, require_client, require_admin_or_client, require_enrolment)


# The OpenAPI of routes that read a raw safetensors body themselves (read_limited_body).
SAFETENSORS_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "A safetensors file: the prompt tensors, metadata in its header.",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}


async def read_limited_body(request: Request, limit: int, ticket: Ticket | None = None) -> bytes:
    """Read a request body, refusing it (413) as soon as it exceeds `limit` bytes.

    With a ticket of the upload gate, the declared size is reserved before a byte is read and what
    streams in past it is counted as it arrives (429 when the holder's bytes in flight are over)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise Invalid("invalid Content-Length header") from None
        if size > limit:
            raise TooLarge(f"body of {size} bytes exceeds the upload limit of {limit} bytes")
        if ticket is not None:
            ticket.add(size)
    # one growing buffer rather than a list of chunks: one large allocation, which the allocator
    # hands back to the system when a cut-off upload drops it, instead of thousands of small ones
    body = bytearray()
    async for chunk in request.stream():
        if len(body) + len(chunk) > limit:
            raise TooLarge(f"body exceeds the upload limit of {limit} bytes")
        body += chunk
        if ticket is not None and len(body) > ticket.bytes:
            ticket.add(len(body) - ticket.bytes)
    return bytes(body)


def upload_ticket(request: Request, holder: int | str) -> Ticket:
    """A place among the uploads in progress of a client (or 'admin'), or 429 (see inflight.py)."""
    return request.app.state.upload_gate.open(holder)
