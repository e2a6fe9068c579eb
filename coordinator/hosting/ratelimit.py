"""Per-IP rate limits on enrolment and on failed authentications (the `limits` library).

Two limits, both keyed by the client's IP address (``request.client.host``; behind a reverse
proxy, uvicorn takes it from X-Forwarded-For only when the proxy is in FEDPROMPT_TRUSTED_PROXIES,
empty by default: no address is trusted, loopback included):

- enrolment: every ``POST /api/v1/federations/{fid}/clients`` counts, accepted or not;
- failed authentications: every request refused for a missing, unknown or expired token, a wrong
  admin token, a refused enrolment token or a failed dashboard login counts. Once an address has
  used up its allowance, a request from it that needs a token is answered 429 (before its token is
  looked at) until the moving window frees a slot, unless its credential is too long to guess
  (api/ratelimit_dep.py: issued tokens, the session cookie, an admin token of 32+ characters).

The answer is a 429 problem+json with ``Retry-After`` (seconds). Counters live in this process's
memory (a moving window): several coordinator processes behind one address each count on their own.
"""

from __future__ import annotations

import math
import time

from fedprompt.coordinator.errors import ServiceError
from limits import RateLimitItem, parse_many
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter


class RateLimited(ServiceError):
    """Too many requests from one address; ``retry_after`` says when to try again (seconds)."""

    status, title = 429, "Too many requests"

    def __init__(self, detail: str, *, retry_after: int) -> None:
        super().__init__(detail, retry_after=retry_after)
        self.retry_after = retry_after
        self.headers = {"Retry-After": str(retry_after)}


def parse_limits(text: str) -> list[RateLimitItem]:
    """Parse a limit such as ``"30/minute"`` or ``"30/minute;300/hour"``; ValueError if malformed."""
    try:
        items = parse_many(text)
    except ValueError as exc:
        raise ValueError(
            f"invalid rate limit {text!r}: {exc}; write e.g. '30/minute' or '30/minute;300/hour'"
        ) from None
    if not items:
        raise ValueError(f"invalid rate limit {text!r}; write e.g. '30/minute'")
    return items


class RateLimiter:
    """The coordinator's two per-IP limits; ``enabled=False`` turns both off."""

    def __init__(self, *, enrolment: str, failed_auth: str, enabled: bool = True) -> None:
        self.enabled = enabled
        self.enrolment = parse_limits(enrolment)
        self.failed_auth = parse_limits(failed_auth)
        self._limiter = MovingWindowRateLimiter(MemoryStorage())

    def _retry_after(self, items: list[RateLimitItem], key: str) -> int:
        now = time.time()
        waits = [
            self._limiter.get_window_stats(item, key).reset_time - now
            for item in items
            if not self._limiter.test(item, key)
        ]
        return max(1, math.ceil(max(waits, default=1)))

    def check_failed_auth(self, ip: str) -> None:
        """429 if this address has used up its failed authentications."""
        if not self.enabled:
            return
        key = f"auth-failed|{ip}"
        if all(self._limiter.test(item, key) for item in self.failed_auth):
            return
        raise RateLimited(
            f"too many failed authentications from {ip} (limit {_describe(self.failed_auth)}); "
            "check the token you send, then retry after the Retry-After delay",
            retry_after=self._retry_after(self.failed_auth, key),
        )

    def record_failed_auth(self, ip: str) -> None:
        """Count one failed authentication of this address."""
        if self.enabled:
            for item in self.failed_auth:
                self._limiter.hit(item, f"auth-failed|{ip}")

    def hit_enrolment(self, ip: str) -> None:
        """Count one enrolment attempt of this address; 429 if it is over its limit."""
        if not self.enabled:
            return
        key = f"enrol|{ip}"
        # Test all first so that a refused attempt does not use up the other windows.
        if all(self._limiter.test(item, key) for item in self.enrolment):
            for item in self.enrolment:
                self._limiter.hit(item, key)
            return
        raise RateLimited(
            f"too many enrolments from {ip} (limit {_describe(self.enrolment)}); "
            "retry after the Retry-After delay",
            retry_after=self._retry_after(self.enrolment, key),
        )


def _describe(items: list[RateLimitItem]) -> str:
    return "; ".join(str(item) for item in items)
