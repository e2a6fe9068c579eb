"""The simulation's process supervisor: restarts of pool processes, memory of the whole process tree."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from fedprompt.sim.supervisor import Processes, SimulationError


def _wait_exit(procs: Processes, name: str) -> None:
    deadline = time.monotonic() + 30
    while any(n == name and p.poll() is None for n, p in procs.procs):
        assert time.monotonic() < deadline, f"{name} did not exit"
        time.sleep(0.05)


def test_a_restartable_child_is_started_again_until_its_restarts_are_spent(tmp_path: Path) -> None:
    seen: list[tuple[str, int]] = []
    procs = Processes(on_restart=lambda name, code: seen.append((name, code)))
    try:
        procs.start(
            "flaky", [sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "f.log", {}, restarts=2
        )

        for _ in range(2):
            _wait_exit(procs, "flaky")
            procs.check()  # restarts it
        _wait_exit(procs, "flaky")

        with pytest.raises(SimulationError, match="flaky exited with code 3"):
            procs.check()
        assert seen == [("flaky", 3), ("flaky", 3)]
    finally:
        procs.stop()


def test_a_child_without_restarts_ends_the_simulation(tmp_path: Path) -> None:
    procs = Processes()
    try:
        procs.start("coordinator", [sys.executable, "-c", "raise SystemExit(1)"], tmp_path / "c.log", {})
        _wait_exit(procs, "coordinator")
        with pytest.raises(SimulationError, match="coordinator exited with code 1"):
            procs.check()
    finally:
        procs.stop()


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_memory_counts_every_live_child(tmp_path: Path) -> None:
    procs = Processes()
    alone = procs.rss_bytes()
    hold = "import time; x = bytearray(200 * 2**20); x[::4096] = b'1' * len(x[::4096]); time.sleep(60)"
    try:
        procs.start("big", [sys.executable, "-c", hold], tmp_path / "b.log", {})
        deadline = time.monotonic() + 30
        while (procs.rss_bytes() or 0) - (alone or 0) < 200 * 2**20:
            assert time.monotonic() < deadline, "the child's 200 MiB never showed"
            time.sleep(0.1)
    finally:
        procs.stop()
    assert alone is not None and (procs.peak_rss or 0) >= alone + 200 * 2**20
