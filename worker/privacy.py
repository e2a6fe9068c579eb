"""Local differential privacy for prompt updates (FedPrompt's LDP), as pure functions: no I/O.

A client clips its update (new prompt − global prompt) to an L1 norm bound and adds Laplace noise
of scale bound/ε to every element before upload: the released update is ε-DP with respect to the
client's update (sensitivity = the L1 bound). Over rounds, ε adds up (basic composition).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


class PrivacyError(ValueError):
    """A privacy setting that cannot work."""


def clip_l1(delta: Mapping[str, np.ndarray], bound: float) -> tuple[dict[str, np.ndarray], float]:
    """Scale the update so its L1 norm (over all tensors) is at most `bound`; returns (clipped, original norm)."""
    if not bound > 0:
        raise PrivacyError(f"the L1 clipping bound must be positive; got {bound}")
    norm = float(sum(np.abs(v.astype(np.float64)).sum() for v in delta.values()))
    scale = min(1.0, bound / norm) if norm > 0 else 1.0
    return {k: v.astype(np.float64) * scale for k, v in delta.items()}, norm


def laplace_ldp(
    update: Mapping[str, np.ndarray],
    global_prompt: Mapping[str, np.ndarray],
    *,
    bound: float,
    epsilon: float,
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    """global + clip_l1(update − global, bound) + Laplace(0, bound/ε) noise, cast back to the update's dtype."""
    if not epsilon > 0:
        raise PrivacyError(f"epsilon must be positive; got {epsilon}")
    delta = {k: v.astype(np.float64) - global_prompt[k].astype(np.float64) for k, v in update.items()}
    clipped, _ = clip_l1(delta, bound)
    scale = bound / epsilon
    return {
        k: (global_prompt[k].astype(np.float64) + c + rng.laplace(0.0, scale, size=c.shape)).astype(
            update[k].dtype
        )
        for k, c in clipped.items()
    }


def cumulative_epsilon(per_round: Sequence[float]) -> float:
    """Basic composition: the ε of every round the client took part in, summed."""
    if any(e < 0 for e in per_round):
        raise PrivacyError("a round's epsilon cannot be negative")
    return float(sum(per_round))
