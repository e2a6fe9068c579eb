"""Buffered asynchronous aggregation (FedBuff, Nguyen et al., AISTATS 2022): pure functions, no I/O.

In mode async a client trains from whatever version was the latest when it asked, so the updates in
one buffer start from different versions. Each update enters the buffer as its change from its own
base, Δ_k = y_k − x_{b_k}, weighted by its staleness τ_k = v − b_k (v the version the buffer builds
on: how many versions were written since the client's base) through s(τ) = 1/√(1 + τ). The buffer is
then the usual aggregation of *rebased* prompts

    z_k = x_v + s(τ_k)·Δ_k

so FedAvg over them (weights n_k, the clients' sample counts) gives x_v + Σ n_k s(τ_k) Δ_k / Σ n_k,
and a robust rule sees every update as a prompt relative to the same x_v. With fresh updates (τ = 0)
a buffer is exactly FedAvg of its clients' prompts. The server's learning rate η then moves x_v
towards the aggregate, x_{v+1} = x_v + η·(aggregate − x_v), before any server optimiser steps.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping

import numpy as np

Tensors = dict[str, np.ndarray]


def staleness_weight(tau: int) -> float:
    """s(τ) = 1/√(1 + τ): FedBuff's polynomial down-weighting of an update τ versions stale."""
    if tau < 0:
        raise ValueError(f"staleness cannot be negative (got {tau})")
    return 1.0 / math.sqrt(1.0 + tau)


def staleness(buffer_base: int, client_base: int) -> int:
    """Versions written since the client's base, as seen by a buffer building on `buffer_base`."""
    return buffer_base - client_base


def too_stale(tau: int, max_staleness: int) -> bool:
    """Whether an update τ versions stale is refused."""
    return tau > max_staleness


def rebase(
    current: Mapping[str, np.ndarray],
    base: Mapping[str, np.ndarray],
    update: Mapping[str, np.ndarray],
    tau: int,
) -> Tensors:
    """z = x_v + s(τ)·(y − x_b): the update's change from its own base, down-weighted by its staleness,
    applied to the version the buffer builds on (float64, as the aggregation rules compute)."""
    w = staleness_weight(tau)
    return {
        name: np.asarray(current[name], dtype=np.float64)
        + w * (np.asarray(update[name], dtype=np.float64) - np.asarray(base[name], dtype=np.float64))
        for name in current
    }


def server_move(current: Mapping[str, np.ndarray], aggregate: Mapping[str, np.ndarray], lr: float) -> Tensors:
    """x_v + η·(aggregate − x_v): the server's learning rate on the buffered mean (η = 1: the aggregate),
    in the dtype of x_v (the prompt's, float32)."""
    out: Tensors = {}
    for name, x in current.items():
        x64 = np.asarray(x, dtype=np.float64)
        moved = x64 + lr * (np.asarray(aggregate[name], dtype=np.float64) - x64)
        out[name] = moved.astype(np.asarray(x).dtype)
    return out


def staleness_histogram(taus: Iterable[int]) -> dict[str, int]:
    """How many updates had each staleness, keyed by τ as text (a JSON object), in ascending order."""
    counts = Counter(int(t) for t in taus)
    return {str(tau): counts[tau] for tau in sorted(counts)}


def throughput(updates: int, first_at: float, last_at: float) -> float | None:
    """A client's accepted updates per minute between its first and its last (None below two)."""
    if updates < 2 or last_at <= first_at:
        return None
    return 60.0 * (updates - 1) / (last_at - first_at)
