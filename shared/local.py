"""Helpers for running services on this machine's loopback: free ports, readiness; the CPU's name."""

from __future__ import annotations

import functools
import itertools
import platform
import random
import socket
import ssl
import time
from collections.abc import Callable
from pathlib import Path

import httpx

_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST_PORT = 10000  # above the well-known and most registered service ports


def _ephemeral_floor() -> int:
    """The lowest port the kernel hands to outgoing connections (Linux's default: 32768)."""
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """An unused loopback port for a server this process is about to start.

    Chosen below the kernel's ephemeral range: a port the kernel picked there (bind to 0) can be
    taken by any outgoing connection on this machine before the server binds it, and on a busy
    machine one is (the server then exits with 'address already in use')."""
    low, high = _LOWEST_PORT, _ephemeral_floor()
    rng = random.SystemRandom()
    below = (rng.randrange(low, high) for _ in range(64 if high - low > 1000 else 0))
    # port 0 (the kernel's pick) only when no port below its range was free
    for port in itertools.chain(below, [0]):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                if port == 0:
                    raise
                continue
            return int(s.getsockname()[1])  # an AF_INET address: (host, port)
    raise AssertionError("unreachable: binding port 0 returns or raises")


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


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str] | None:
    """The flags every core has, from the flags lines of /proc/cpuinfo (read once) or of `cpuinfo`
    as given; None where they cannot be read (not Linux)."""
    text = _proc_cpuinfo() if cpuinfo is None else cpuinfo
    cores = [set(line.partition(":")[2].split()) for line in text.splitlines() if line.startswith("flags")]
    return frozenset(set.intersection(*cores)) if cores else None


@functools.cache
def _proc_cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), so a timing can be read against the machine it ran on."""
    for line in _proc_cpuinfo().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()
