"""Local differential privacy for prompt updates (FedPrompt's LDP), as pure functions: no I/O.

Two mechanisms, both applied by a client to its update (new prompt − global prompt) before upload.
Local DP protects the client's whole input: any two of its possible updates, each clipped to norm B,
differ by up to 2·B in that norm (an update u and its opposite −u), so the sensitivity of the clipped
update is 2·B (``SENSITIVITY_FACTOR``), and the noise is calibrated to it:

- ``laplace`` (the paper's): clip the update's L1 norm to B, add Laplace noise of scale 2·B/ε to
  every element. Each release is ε-DP; over rounds, ε adds up (basic composition).
- ``gaussian``: clip the update's L2 norm to B, add Gaussian noise of standard deviation σ·2·B to
  every element, where the noise multiplier σ (std / sensitivity) is the smallest that makes one
  release (ε, δ)-DP. Both σ and the composition over the rounds a client took part in come from the
  PRV accountant (Gopi et al., 2021; the ``prv-accountant`` package), which composes tightly: n
  rounds cost far less than n·ε.

Builds before this calibration used B itself as the sensitivity (Laplace scale B/ε, Gaussian std
σ·B): their releases were 2ε-DP (Laplace), and (ε', δ)-DP with ε' the accountant's figure for σ/2
(Gaussian); ``uncalibrated_epsilon`` computes what such a release guaranteed.

The noise comes from the generator the caller passes: a worker draws it from OS entropy (the
default in production: noise derived from a seed anyone else knows could be subtracted), a simulation
from a seeded one (``ldp_rng``) so that its LDP runs can be reproduced.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

# Accuracy asked of the accountant, relative to the ε it computes: ε is reported as the accountant's
# upper bound, within 0.1 % of the truth.
EPS_RELATIVE_ERROR = 1e-3
DELTA_RELATIVE_ERROR = 1e-3


# Two updates clipped to norm B differ by at most 2·B in that norm: the sensitivity the noise covers.
SENSITIVITY_FACTOR = 2.0


class PrivacyError(ValueError):
    """A privacy setting that cannot work."""


def update_delta(
    update: Mapping[str, np.ndarray], global_prompt: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """update − global prompt, per tensor, in float64."""
    return {k: v.astype(np.float64) - global_prompt[k].astype(np.float64) for k, v in update.items()}


def _clip(delta: Mapping[str, np.ndarray], bound: float, norm: float) -> dict[str, np.ndarray]:
    if not bound > 0:
        raise PrivacyError(f"the clipping bound must be positive; got {bound}")
    scale = min(1.0, bound / norm) if norm > 0 else 1.0
    return {k: v.astype(np.float64) * scale for k, v in delta.items()}


def l1_norm(delta: Mapping[str, np.ndarray]) -> float:
    """The L1 norm of an update over all its tensors."""
    return float(sum(np.abs(v.astype(np.float64)).sum() for v in delta.values()))


def l2_norm(delta: Mapping[str, np.ndarray]) -> float:
    """The L2 norm of an update over all its tensors."""
    return math.sqrt(sum(float(np.square(v.astype(np.float64)).sum()) for v in delta.values()))


def clip_l1(delta: Mapping[str, np.ndarray], bound: float) -> tuple[dict[str, np.ndarray], float]:
    """Scale the update so its L1 norm (over all tensors) is at most `bound`; returns (clipped, original norm)."""
    norm = l1_norm(delta)
    return _clip(delta, bound, norm), norm


def clip_l2(delta: Mapping[str, np.ndarray], bound: float) -> tuple[dict[str, np.ndarray], float]:
    """Scale the update so its L2 norm (over all tensors) is at most `bound`; returns (clipped, original norm)."""
    norm = l2_norm(delta)
    return _clip(delta, bound, norm), norm


def _release(
    update: Mapping[str, np.ndarray],
    global_prompt: Mapping[str, np.ndarray],
    clipped: Mapping[str, np.ndarray],
    noise: Callable[[tuple[int, ...]], np.ndarray],
) -> dict[str, np.ndarray]:
    """global + clipped update + noise, cast back to the update's dtype."""
    return {
        k: (global_prompt[k].astype(np.float64) + c + noise(c.shape)).astype(update[k].dtype)
        for k, c in clipped.items()
    }


def ldp_rng(seed: int | None, round_number: int) -> np.random.Generator:
    """The generator of one release's noise: OS entropy without a seed (production workers), else
    seeded by (seed, round) so that a simulation's LDP noise is the same on every run."""
    if seed is None:
        return np.random.default_rng()
    return np.random.default_rng([int(seed) & 0xFFFFFFFFFFFFFFFF, int(round_number)])


def client_noise_seed(seed: int, client_index: int) -> int:
    """A simulation's LDP noise seed for one client: from the run's --seed and the client's index."""
    return int(np.random.SeedSequence([int(seed), int(client_index)]).generate_state(1, np.uint64)[0] >> 1)


def laplace_scale(bound: float, epsilon: float) -> float:
    """The Laplace mechanism's scale for an update clipped to L1 norm `bound`: sensitivity 2·bound over ε."""
    if not epsilon > 0:
        raise PrivacyError(f"epsilon must be positive; got {epsilon}")
    return SENSITIVITY_FACTOR * bound / epsilon


def gaussian_std(bound: float, noise_multiplier: float) -> float:
    """The Gaussian mechanism's noise std for an update clipped to L2 norm `bound`: σ × sensitivity 2·bound."""
    if not noise_multiplier > 0:
        raise PrivacyError(f"the noise multiplier must be positive; got {noise_multiplier}")
    return noise_multiplier * SENSITIVITY_FACTOR * bound


def laplace_ldp(
    update: Mapping[str, np.ndarray],
    global_prompt: Mapping[str, np.ndarray],
    *,
    bound: float,
    epsilon: float,
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    """global + clip_l1(update − global, bound) + Laplace(0, 2·bound/ε) noise, cast back to the update's
    dtype: ε-DP for any two updates of the client."""
    scale = laplace_scale(bound, epsilon)
    clipped, _ = clip_l1(update_delta(update, global_prompt), bound)
    return _release(update, global_prompt, clipped, lambda shape: rng.laplace(0.0, scale, size=shape))


def gaussian_ldp(
    update: Mapping[str, np.ndarray],
    global_prompt: Mapping[str, np.ndarray],
    *,
    bound: float,
    noise_multiplier: float,
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    """global + clip_l2(update − global, bound) + N(0, (noise_multiplier·2·bound)²) noise per element."""
    std = gaussian_std(bound, noise_multiplier)
    clipped, _ = clip_l2(update_delta(update, global_prompt), bound)
    return _release(update, global_prompt, clipped, lambda shape: rng.normal(0.0, std, size=shape))


def cumulative_epsilon(per_round: Sequence[float]) -> float:
    """Basic composition: the ε of every round the client took part in, summed."""
    if any(e < 0 for e in per_round):
        raise PrivacyError("a round's epsilon cannot be negative")
    return float(sum(per_round))


def _check_gaussian(epsilon: float, delta: float) -> None:
    if not 0.05 <= epsilon <= 100:
        raise PrivacyError(f"the Gaussian mechanism takes epsilon in [0.05, 100] per round; got {epsilon}")
    if not 1e-10 <= delta <= 0.1:
        raise PrivacyError(f"delta must lie in [1e-10, 0.1]; got {delta}")


@functools.lru_cache(maxsize=1024)
def gaussian_epsilon(noise_multiplier: float, delta: float, rounds: int = 1, scale: float = 1.0) -> float:
    """ε (at δ) of `rounds` releases of the Gaussian mechanism with this noise multiplier, composed
    by the PRV accountant; the accountant's upper bound, so never an underestimate. `scale`: the
    expected size of ε (the accountant works to 0.1 % of it; finer costs seconds at large ε)."""
    from prv_accountant import PRVAccountant
    from prv_accountant.privacy_random_variables import GaussianMechanism

    if rounds <= 0:
        return 0.0
    accountant = PRVAccountant(
        prvs=[GaussianMechanism(noise_multiplier=noise_multiplier)],
        max_self_compositions=[rounds],
        eps_error=max(EPS_RELATIVE_ERROR * scale, 1e-4),
        delta_error=DELTA_RELATIVE_ERROR * delta,
    )
    _, _, upper = accountant.compute_epsilon(delta=delta, num_self_compositions=[rounds])
    return float(upper)


@functools.lru_cache(maxsize=256)
def gaussian_noise_multiplier(epsilon: float, delta: float) -> float:
    """The smallest noise multiplier σ (noise std / L2 bound) that makes one release (ε, δ)-DP by the
    accountant, found by bisection in log space to 0.1 % of σ."""
    _check_gaussian(epsilon, delta)
    lo, hi = 1e-2, 1e3  # ε(1e-2) is in the thousands at any sane δ, ε(1e3) below 0.01
    if gaussian_epsilon(hi, delta, 1, epsilon) > epsilon:
        raise PrivacyError(f"epsilon {epsilon} at delta {delta} needs more noise than this build calibrates")
    while hi / lo > 1.001:
        mid = math.sqrt(lo * hi)
        if gaussian_epsilon(mid, delta, 1, epsilon) > epsilon:
            lo = mid
        else:
            hi = mid
    return hi


def spent_epsilon(mechanism: str, epsilon: float, delta: float | None, rounds: int) -> float:
    """A client's cumulative ε after `rounds` releases: basic composition for Laplace, the PRV
    accountant's composition (at δ) for Gaussian."""
    if rounds < 0:
        raise PrivacyError("a client cannot have taken part in a negative number of rounds")
    if mechanism == "laplace":
        return cumulative_epsilon([epsilon] * rounds)
    if mechanism == "gaussian":
        if delta is None:
            raise PrivacyError("the Gaussian mechanism needs delta")
        return gaussian_epsilon(gaussian_noise_multiplier(epsilon, delta), delta, rounds, epsilon * rounds)
    raise PrivacyError(f"unknown privacy mechanism '{mechanism}'; use laplace or gaussian")


def uncalibrated_epsilon(mechanism: str, epsilon: float, delta: float | None, rounds: int) -> float:
    """What `rounds` releases of a build that took the clipping bound itself as the sensitivity
    (Laplace scale bound/ε, Gaussian std σ(ε, δ)·bound) guaranteed against the true sensitivity
    2·bound: 2ε per release for Laplace (basic composition), the accountant's ε at δ for the noise
    multiplier σ/2 for Gaussian."""
    if rounds <= 0:
        return 0.0
    if mechanism == "laplace":
        return cumulative_epsilon([SENSITIVITY_FACTOR * epsilon] * rounds)
    if mechanism == "gaussian":
        if delta is None:
            raise PrivacyError("the Gaussian mechanism needs delta")
        sigma = gaussian_noise_multiplier(epsilon, delta) / SENSITIVITY_FACTOR
        return gaussian_epsilon(sigma, delta, rounds, SENSITIVITY_FACTOR * epsilon * rounds)
    raise PrivacyError(f"unknown privacy mechanism '{mechanism}'; use laplace or gaussian")
