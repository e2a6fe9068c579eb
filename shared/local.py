"""Helpers for running services on this machine's loopback: free ports, readiness; the CPU's name."""

from __future__ import annotations

import platform
import socket
import ssl
import time
from collections.abc import Callable
from pathlib import Path

import httpx


def free_port() -> int:
    """An unused loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # an AF_INET address: (host, port)


def wait_ready(
    url: str,
    timeout: float = 120.0,
    check: Callable[[], None] | None = None,
    *,
    verify: ssl.SSLContext | bool = True,
) -> None:
    """Poll `url`/readyz until it answers 200; `check` may raise to give up early (a dead process);
    `verify`: httpx's, for an https coordinator with a private CA."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check is not None:
            check()
        try:
            if httpx.get(f"{url}/readyz", timeout=2, verify=verify).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} did not become ready in {timeout:.0f}s")


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), so a timing can be read against the machine it ran on."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
