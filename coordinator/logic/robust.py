"""Robust aggregation rules beside FedAvg: pure functions over [(tensors, weight), ...]. No I/O.

Each rule works on the updates flattened to vectors (float64) and returns the new tensors plus a
note for every update it rejected or clipped, which the coordinator records in the round history.
"""

from __future__ import annotations

import math

import numpy as np
from fedprompt.coordinator.logic.aggregation import (
    AggregationError,
    AggregationResult,
    Tensors,
    Weighted,
    _check,
    fedavg,
    register,
)


def _flatten(updates: Weighted, names: list[str]) -> np.ndarray:
    return np.stack(
        [np.concatenate([np.asarray(t[n], dtype=np.float64).ravel() for n in names]) for t, _ in updates]
    )


def _unflatten(vector: np.ndarray, like: Tensors, names: list[str]) -> dict[str, np.ndarray]:
    out, at = {}, 0
    for name in names:
        size = like[name].size
        out[name] = vector[at : at + size].reshape(like[name].shape).astype(like[name].dtype)
        at += size
    return out


@register("median")
def median(updates: Weighted, *, global_tensors: Tensors | None = None) -> AggregationResult:
    """Coordinate-wise median (unweighted): tolerates up to half of the rows being adversarial."""
    del global_tensors
    names = _check(updates)
    x = _flatten(updates, names)
    return AggregationResult(_unflatten(np.median(x, axis=0), updates[0][0], names))


@register("trimmed_mean")
def trimmed_mean(
    updates: Weighted, *, beta: float = 0.1, global_tensors: Tensors | None = None
) -> AggregationResult:
    """Coordinate-wise mean after dropping the floor(beta*n) smallest and largest values."""
    del global_tensors
    names = _check(updates)
    if not 0 <= beta < 0.5:
        raise AggregationError(f"trimmed_mean: beta must be in [0, 0.5); got {beta}")
    x = np.sort(_flatten(updates, names), axis=0)
    k = math.floor(beta * len(x))
    return AggregationResult(_unflatten(x[k : len(x) - k].mean(axis=0), updates[0][0], names))


def _krum_scores(x: np.ndarray, f: int) -> np.ndarray:
    n = len(x)
    # Squared distances from the Gram matrix: K x K floats, never the K x K x d differences.
    x = x - x.mean(axis=0)  # centred, so the subtraction below loses little precision
    sq = np.einsum("ij,ij->i", x, x)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * (x @ x.T), 0.0)
    np.fill_diagonal(d2, np.inf)
    closest = n - f - 2
    scores: np.ndarray = np.partition(d2, closest - 1, axis=1)[:, :closest].sum(axis=1)
    return scores


def _krum(updates: Weighted, f: int, m: int, label: str) -> AggregationResult:
    names = _check(updates)
    n = len(updates)
    if f < 0 or n < 2 * f + 3:
        raise AggregationError(f"{label}: needs n >= 2f + 3 updates; got n={n}, f={f}")
    if not 1 <= m <= n - f:
        raise AggregationError(f"{label}: m must be in [1, n - f] = [1, {n - f}]; got {m}")
    scores = _krum_scores(_flatten(updates, names), f)
    chosen = sorted(np.argsort(scores, kind="stable")[:m].tolist())
    notes = {i: f"{label}: not selected (score {scores[i]:.4g})" for i in range(n) if i not in chosen}
    return AggregationResult(fedavg([updates[i] for i in chosen]), notes)


@register("krum")
def krum(updates: Weighted, *, f: int = 1, global_tensors: Tensors | None = None) -> AggregationResult:
    """Krum (Blanchard et al. 2017): the update closest to its n - f - 2 nearest neighbours."""
    del global_tensors
    return _krum(updates, int(f), 1, "krum")


@register("multi_krum")
def multi_krum(
    updates: Weighted, *, f: int = 1, m: int | None = None, global_tensors: Tensors | None = None
) -> AggregationResult:
    """Multi-Krum: FedAvg of the m best-scored updates (default m = n - f)."""
    del global_tensors
    return _krum(updates, int(f), int(m) if m is not None else len(updates) - int(f), "multi_krum")


@register("norm_bound")
def norm_bound(
    updates: Weighted, *, bound: float = 1.0, global_tensors: Tensors | None = None
) -> AggregationResult:
    """Clip each update's L2 distance to the global prompt to `bound`, then FedAvg (Sun et al. 2019)."""
    names = _check(updates)
    if not bound > 0:
        raise AggregationError(f"norm_bound: bound must be positive; got {bound}")
    if global_tensors is None:
        raise AggregationError("norm_bound needs the previous global prompt")
    g = _flatten([(global_tensors, 1.0)], names)[0]
    clipped, notes = [], {}
    for i, (tensors, weight) in enumerate(updates):
        delta = _flatten([(tensors, 1.0)], names)[0] - g
        norm = float(np.linalg.norm(delta))
        if norm > bound:
            delta *= bound / norm
            notes[i] = f"norm_bound: clipped from {norm:.4g} to {bound:.4g}"
        clipped.append((_unflatten(g + delta, tensors, names), weight))
    return AggregationResult(fedavg(clipped), notes)


@register("stats_filter")
def stats_filter(
    updates: Weighted, *, k: float = 3.0, global_tensors: Tensors | None = None
) -> AggregationResult:
    """Reject updates whose element mean or std is more than k robust stds from the round's median."""
    del global_tensors
    names = _check(updates)
    if not k > 0:
        raise AggregationError(f"stats_filter: k must be positive; got {k}")
    x = _flatten(updates, names)
    notes: dict[int, str] = {}
    for stat_name, values in (("mean", x.mean(axis=1)), ("std", x.std(axis=1))):
        center = float(np.median(values))
        robust_std = 1.4826 * float(np.median(np.abs(values - center)))
        # A floor keeps identical honest statistics from turning every tiny difference into an outlier.
        scale = max(robust_std, 1e-6 * max(abs(center), 1e-12))
        for i, v in enumerate(values):
            if abs(v - center) > k * scale and i not in notes:
                notes[i] = (
                    f"stats_filter: element {stat_name} {v:.4g} is {abs(v - center) / scale:.1f} robust stds from the median {center:.4g}"
                )
    kept = [updates[i] for i in range(len(updates)) if i not in notes]
    if not kept:
        raise AggregationError("stats_filter rejected every update")
    return AggregationResult(fedavg(kept), notes)
