"""bench/peers.py's own parts: the process-tree memory sampler, the overhead rule and the summary.

The Flower side needs its own environment (`make bench-peers`), so the whole comparison is not run here.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from bench import peers

# A parent that starts a child holding 200 MiB it has written to (so the pages are resident).
_TREE = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', "
    "'b = bytearray(200 * 2**20)\\nfor i in range(0, len(b), 4096): b[i] = 1\\nimport time; time.sleep(3)'])\n"
    "child.wait()\n"
)


def test_the_sampler_counts_the_children_of_the_process() -> None:
    proc = subprocess.Popen([sys.executable, "-c", _TREE])
    memory = peers.TreeMemory(proc.pid, 0.1)
    memory.start()
    proc.wait()
    memory.stop()
    assert memory.peak_pss >= 200 * 2**20  # the child's 200 MiB, which the parent alone does not hold
    assert memory.peak_rss >= memory.peak_pss
    assert max(memory.names.values()) >= 200 * 2**20


def test_the_sampler_of_a_process_that_has_gone_reads_nothing() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    time.sleep(0.05)
    memory = peers.TreeMemory(proc.pid, 0.1)
    memory.sample()
    assert memory.peak_pss == 0 and memory.names == {}


def test_overhead_is_the_federation_time_not_spent_training_per_round() -> None:
    rounds = [{"train_s": [4.0, 6.0]}, {"train_s": [2.0, 4.0]}]
    # 16 s of training on 2 slots is 8 s of the 20 s federation; 12 s over 2 rounds
    assert peers.overhead_per_round(20.0, rounds, 2) == pytest.approx(6.0)
    assert peers.overhead_per_round(20.0, rounds, 1) == pytest.approx(2.0)


def test_the_summary_gives_ratios_per_repeat_and_the_largest_accuracy_gap() -> None:
    def side(wall: float, acc: float) -> dict[str, float]:
        return {
            "wall_s": wall,
            "federation_s": wall - 5,
            "peak_pss_mib": 1000.0,
            "peak_rss_sum_mib": 1500.0,
            "overhead_per_round_s": 1.0,
            "final_accuracy": acc,
        }

    repeats = [
        {
            "fedprompt": side(90, 0.75),
            "flower": side(100, 0.75),
            "same_clients": True,
            "max_accuracy_gap_points": 0.0,
        },
        {
            "fedprompt": side(60, 0.70),
            "flower": side(50, 0.71),
            "same_clients": True,
            "max_accuracy_gap_points": 1.0,
        },
    ]
    out = peers.summary(repeats)
    assert out["wall_s"]["ratio"]["values"] == pytest.approx([0.9, 1.2])
    assert out["wall_s"]["ratio"]["median"] == pytest.approx(1.05)
    assert out["peak_pss_mib"]["ratio"]["values"] == pytest.approx([1.0, 1.0])
    assert out["max_accuracy_gap_points"] == 1.0 and out["same_clients"] is True
