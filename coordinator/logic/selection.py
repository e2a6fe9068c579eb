"""Client selection: a seeded, reproducible sample of the available clients. No I/O."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def select_clients(
    available: Sequence[int], n: int, *, seed: int, round_number: int, attempt: int
) -> list[int]:
    """Pick n of the available client ids with an RNG seeded by (seed, round, attempt); sorted result."""
    pool = sorted(set(available))
    if n > len(pool):
        raise ValueError(f"cannot select {n} clients from {len(pool)} available")
    rng = np.random.default_rng([seed, round_number, attempt])
    picked = rng.choice(len(pool), size=n, replace=False)
    return sorted(pool[i] for i in picked)
