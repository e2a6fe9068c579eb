"""Retrying the coordinator: network faults, 5xx, 408 and 429 are retried with exponential backoff and
jitter (tenacity), honouring Retry-After; any other answer is final. A stopping worker stops retrying."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TypeVar

import httpx
from fedprompt.shared.client import ApiError
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_never, wait_random_exponential

log = logging.getLogger("fedprompt.worker")
T = TypeVar("T")


class Stopped(Exception):
    """The worker is shutting down."""


def is_transient(exc: BaseException) -> bool:
    """Network errors, 5xx, 429 and 408 are worth retrying; other 4xx are answers."""
    if isinstance(exc, httpx.TransportError):
        return True
    return isinstance(exc, ApiError) and (exc.status >= 500 or exc.status in (408, 429))


def _wait(state: RetryCallState) -> float:
    exc = state.outcome.exception() if state.outcome else None
    retry_after = getattr(exc, "retry_after", None)
    backoff = wait_random_exponential(multiplier=0.5, max=20)(state)
    return max(float(retry_after), backoff) if retry_after else backoff


def _stop_after(stop_event: threading.Event, attempts: int) -> Callable[[RetryCallState], bool]:
    def stop(state: RetryCallState) -> bool:
        return stop_event.is_set() or state.attempt_number >= attempts

    return stop


def with_retries(
    what: str,
    fn: Callable[[], T],
    *,
    stop: threading.Event,
    on_error: Callable[[str], None],
    forever: bool = False,
) -> T:
    """fn() until it answers, a final answer (raised) or 8 attempts (`forever`: until `stop` is set);
    each failure goes to on_error as "what: error" before the pause; a set `stop` raises Stopped."""

    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        on_error(f"{what}: {exc}")
        log.warning("%s failed (%s); retrying", what, exc)
        if stop.is_set():
            raise Stopped()

    retrying = Retrying(
        retry=retry_if_exception(is_transient),
        wait=_wait,
        stop=stop_never if forever else _stop_after(stop, 8),
        before_sleep=before_sleep,
        reraise=True,
    )
    return retrying(fn)
