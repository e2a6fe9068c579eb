"""Fixed-point encoding of updates for secure aggregation, and the error it adds to the weighted mean.

A client's update u (trained prompt − global prompt, flattened in the spec's tensor order) is clipped
element-wise to [−c, c] and mapped onto the 2^b levels of that range by rounding to the nearest level:

    q = round((clip(u) + c) / Δ),  Δ = 2c / (2^b − 1),  q ∈ {0, …, 2^b − 1}.

The client pre-multiplies q by its integer weight w (its num_samples) in the ring Z_2^64, where the
masks live. The coordinator learns S = Σ w·q (mod 2^64) and W = Σ w, and decodes the weighted mean

    ū = (S / W)·Δ − c.

S is exact while W·(2^b − 1) < 2^64 (``ring_capacity``). Each element of each client's encoding is
within Δ/2 of its clipped value, and a weighted mean of such values is within Δ/2 of the weighted mean
of the clipped values, so the result differs from FedAvg of the clipped updates by at most

    Δ/2 = c / (2^b − 1)   per element (``error_bound``),

plus float64 rounding of S / W (relative 2^−52, far below Δ/2 for b ≤ 32). With no element beyond
[−c, c], clipping changes nothing and the bound is to plain FedAvg.
"""

from __future__ import annotations

import numpy as np

RING_BITS = 64
MIN_BITS, MAX_BITS = 8, 32


class QuantisationError(ValueError):
    """A range, precision or weight the ring cannot carry."""


def levels(bits: int) -> int:
    """The number of quantisation levels, 2^bits."""
    if not MIN_BITS <= bits <= MAX_BITS:
        raise QuantisationError(f"bits must be in [{MIN_BITS}, {MAX_BITS}]; got {bits}")
    return 1 << bits


def step(clip: float, bits: int) -> float:
    """Δ, the distance between two levels: 2c / (2^b − 1)."""
    if not clip > 0:
        raise QuantisationError(f"the clipping range must be positive; got {clip}")
    return 2.0 * clip / (levels(bits) - 1)


def error_bound(clip: float, bits: int) -> float:
    """The largest difference, per element, between the decoded weighted mean and FedAvg of the
    clipped updates: Δ/2 = c / (2^b − 1)."""
    return step(clip, bits) / 2.0


def ring_capacity(bits: int) -> int:
    """The largest total weight W for which S = Σ w·q cannot wrap around 2^64."""
    return ((1 << RING_BITS) - 1) // (levels(bits) - 1)


def quantise(update: np.ndarray, clip: float, bits: int) -> np.ndarray:
    """The update clipped to [−c, c] and rounded to its level q ∈ [0, 2^b − 1], as uint64."""
    delta = step(clip, bits)
    clipped = np.clip(np.asarray(update, dtype=np.float64), -clip, clip)
    q = np.rint((clipped + clip) / delta)
    return np.clip(q, 0, levels(bits) - 1).astype(np.uint64)


def dequantise(q: np.ndarray, clip: float, bits: int) -> np.ndarray:
    """Levels (one client's, or a weighted mean of levels as float) back to values in [−c, c]."""
    return np.asarray(q, dtype=np.float64) * step(clip, bits) - clip


def weighted(q: np.ndarray, weight: int) -> np.ndarray:
    """w·q in Z_2^64 (the client's pre-multiplication by its weight)."""
    if weight < 1:
        raise QuantisationError(f"a weight must be a positive integer; got {weight}")
    return (np.asarray(q, dtype=np.uint64) * np.uint64(weight)).astype(np.uint64)


def weighted_mean(total: np.ndarray, weight_total: int, clip: float, bits: int) -> np.ndarray:
    """The decoded weighted mean ū = (S / W)·Δ − c from the unmasked sum S and the total weight W."""
    if weight_total < 1:
        raise QuantisationError("no weight to divide by")
    if weight_total > ring_capacity(bits):
        raise QuantisationError(
            f"a total weight of {weight_total} overflows the ring at {bits} bits (at most "
            f"{ring_capacity(bits)}); lower the bits"
        )
    mean_levels = np.asarray(total, dtype=np.uint64).astype(np.float64) / float(weight_total)
    return dequantise(mean_levels, clip, bits)
