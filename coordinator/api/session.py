"""The dashboard's session cookie and its CSRF guard.

The cookie is not the admin token: it is an expiry, a random session id and an HMAC of both keyed
by the admin token, so it works on every coordinator process sharing the token and dies when the
token is rotated; its logout records the session id in the database (revoked_sessions), and every
process refuses it from then on. Requests that change state with the cookie must also send the
header ``X-Requested-With: fedprompt-dashboard``, which a cross-site form cannot send (with the
cookie's SameSite=Strict, two independent guards against CSRF).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time

from fastapi import Request
from fedprompt.coordinator.config import Settings
from fedprompt.coordinator.errors import Forbidden
from fedprompt.coordinator.service import Coordinator

SESSION_COOKIE = "fedprompt_session"
SESSION_TTL_S = 12 * 3600
CSRF_HEADER = "x-requested-with"
CSRF_VALUE = "fedprompt-dashboard"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

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
    return parsed is not None and not service.enrolment.session_revoked(parsed[0])


def uses_session(request: Request) -> bool:
    """The request authenticates with the dashboard's cookie (it sends no Authorization header)."""
    return "authorization" not in request.headers and SESSION_COOKIE in request.cookies


def check_csrf(request: Request) -> None:
    """A state-changing request made with the session cookie must carry the dashboard's header (403)."""
    if request.method not in SAFE_METHODS and request.headers.get(CSRF_HEADER) != CSRF_VALUE:
        raise Forbidden(
            f"requests that change state with the session cookie need the header "
            f"'X-Requested-With: {CSRF_VALUE}' (protection against cross-site requests)"
        )
