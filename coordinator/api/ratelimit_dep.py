"""Failed authentications counted per address: the wrapper every token check runs in (429 past the
limit of coordinator/hosting/ratelimit.py).

Past the limit, a request is refused before its credential is looked at, unless the credential is
too long to guess (UNGUESSABLE_CHARS or more: every client, enrolment and session token the
coordinator issues, and an admin token of that length). Checking such a credential tells a guesser
nothing it could use, so others' failures from the same address (a shared NAT, a misconfigured
neighbour) do not lock its holder out; failed attempts with it still count. A shorter admin token
stays behind the limit, as does every shorter guess.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from fastapi import Request
from fedprompt.coordinator.errors import Forbidden, Unauthorized
from fedprompt.coordinator.hosting.ratelimit import RateLimiter


class WrongAdminToken(Forbidden):
    """A token was sent to an admin route and it is not the admin token (counts as a failed login)."""


def client_ip(request: Request) -> str:
    """The address rate limits are keyed by (uvicorn resolves X-Forwarded-For only from the proxies
    in FEDPROMPT_TRUSTED_PROXIES; none by default)."""
    return request.client.host if request.client else "unknown"


def get_rate_limiter(request: Request) -> RateLimiter:
    """The per-IP rate limiter of this app."""
    return request.app.state.rate_limiter


# 32 characters: 190+ bits as a URL-safe token; the tokens issued here are 43 (client, enrolment) or
# 22 random characters inside a 60+ character signed value (the dashboard's session cookie).
UNGUESSABLE_CHARS = 32


@contextmanager
def counting_failures(request: Request, *, count: bool = True, credential: str = "") -> Iterator[None]:
    """Refuse (429) an address over its failed-authentication limit, unless `credential` is too long to
    guess (see the module's docstring); count this request's failure."""
    limiter, ip = get_rate_limiter(request), client_ip(request)
    if len(credential) < UNGUESSABLE_CHARS:
        limiter.check_failed_auth(ip)
    try:
        yield
    except (Unauthorized, WrongAdminToken):
        if count:
            limiter.record_failed_auth(ip)
        raise
