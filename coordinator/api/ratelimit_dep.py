"""Failed authentications counted per address: the wrapper every token check runs in (429 past the
limit of coordinator/ratelimit.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from fastapi import Request
from fedprompt.coordinator.errors import Forbidden, Unauthorized
from fedprompt.coordinator.ratelimit import RateLimiter


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
