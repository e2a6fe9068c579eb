"""Whether the coordinator answers: a worker waits for it with backoff, and gives up after a set time
with one line that says so (instead of a traceback, or running on while doing nothing)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
from fedprompt.shared.tls import ClientTLS, default_context

log = logging.getLogger("fedprompt.worker")

DEFAULT_GIVE_UP_AFTER = 300.0


class Unreachable(RuntimeError):
    """The coordinator did not answer for longer than the worker waits; the message is one line."""


def describe(exc: BaseException) -> str:
    """An exception as 'Type: first line of its message'."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def unreachable_message(url: str, seconds: float, last: str) -> str:
    """The one line a worker ends with when the coordinator stays unreachable."""
    return (
        f"the coordinator at {url} stayed unreachable for {seconds:.0f} s ({last}); giving up "
        "(check --coordinator and that the coordinator runs; --give-up-after sets how long to wait)"
    )


def backoff(attempt: int, cap: float = 30.0) -> float:
    """Seconds before retry `attempt` (1, 2, ...): 1, 2, 4, ... up to `cap`."""
    return min(cap, 2.0 ** (attempt - 1))


def _healthz(base: str) -> httpx.Response:
    """GET /healthz, verifying an https coordinator as every other call does (shared/tls.py)."""
    verify = ClientTLS.from_env().verify() if base.startswith("https:") else default_context()
    return httpx.get(f"{base.rstrip('/')}/healthz", timeout=5.0, verify=verify)


def wait_reachable(
    url: str,
    give_up_after: float,
    *,
    stop: threading.Event | None = None,
    probe: Callable[[str], Any] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Any] | None = None,
) -> bool:
    """Probe `url`/healthz until the coordinator answers (any status below 500), retrying with backoff;
    Unreachable once `give_up_after` seconds have passed. False when `stop` was set meanwhile."""
    stop = stop or threading.Event()
    probe = probe or _healthz
    wait = sleep or stop.wait
    started = clock()
    attempt = 0
    while not stop.is_set():
        attempt += 1
        try:
            answer = probe(url)
            status = getattr(answer, "status_code", 200)
            if status < 500:
                return True
            last = f"HTTP {status}"
        except httpx.HTTPError as exc:
            last = describe(exc)
        elapsed = clock() - started
        if elapsed >= give_up_after:
            raise Unreachable(unreachable_message(url, elapsed, last))
        pause = min(backoff(attempt), max(0.0, give_up_after - elapsed))
        log.warning(
            "coordinator %s unreachable (%s); retrying in %.0f s, giving up in %.0f s",
            url,
            last,
            pause,
            give_up_after - elapsed,
        )
        wait(pause)
    return False
