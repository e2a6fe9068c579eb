"""The processes a simulation starts: each with its output in a log, all of them stopped together.

Every child gets SIGTERM when the simulating process dies (Linux prctl), and `Processes.stop` ends
them on success, failure, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class SimulationError(RuntimeError):
    """The simulation cannot go on; the message says why and where to look."""


def die_with_parent() -> None:
    """In the child, before exec: get SIGTERM if the simulate process dies (Linux prctl)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def bin_path(name: str) -> str:
    """A console script of this installation (next to its Python)."""
    return str(Path(sys.executable).parent / name)


@dataclass
class Processes:
    """Every child process the simulation started, so all of them can be stopped."""

    procs: list[tuple[str, subprocess.Popen]] = field(default_factory=list)
    logs: list[Any] = field(default_factory=list)
    # name → (args, log path, env, restarts left) of children that are restarted when they die
    restartable: dict[str, tuple[list[str], Path, dict[str, str], int]] = field(default_factory=dict)
    on_restart: Callable[[str, int], None] | None = None
    peak_rss: int | None = None  # the largest rss_bytes() seen

    def start(
        self, name: str, args: list[str], log_path: Path, env: dict[str, str], *, restarts: int = 0
    ) -> subprocess.Popen:
        """Start a child with its output in a log file; one with `restarts` > 0 is started again (at most
        that many times) when it dies."""
        proc = self._spawn(args, log_path, env)
        self.procs.append((name, proc))
        if restarts > 0:
            self.restartable[name] = (args, log_path, env, restarts)
        return proc

    def _spawn(self, args: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen:
        log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.logs.append(log)
        return subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=die_with_parent,
            start_new_session=True,
        )

    def check(self) -> None:
        """Restart a restartable child that died; raise if another child died or one died too often."""
        for index, (name, proc) in enumerate(list(self.procs)):
            if proc.poll() is None:
                continue
            args, log_path, env, left = self.restartable.get(name, ([], Path(), {}, 0))
            if left <= 0:
                raise SimulationError(f"{name} exited with code {proc.returncode}")
            if self.on_restart is not None:
                self.on_restart(name, proc.returncode)
            self.restartable[name] = (args, log_path, env, left - 1)
            self.procs[index] = (name, self._spawn(args, log_path, env))

    def rss_bytes(self) -> int | None:
        """Resident memory of this process and every live child, summed (Linux /proc; None elsewhere)."""
        pids = [os.getpid()] + [proc.pid for _, proc in self.procs if proc.poll() is None]
        total = 0
        for pid in pids:
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                if pid == os.getpid():
                    return None  # no /proc here
                continue  # exited meanwhile
            for line in status.splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        self.peak_rss = max(self.peak_rss or 0, total)
        return total

    def stop(self) -> None:
        """SIGTERM everyone, wait, SIGKILL stragglers."""
        for _, proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 20
        for _, proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in self.logs:
            log.close()
