"""Client-drift correction: FedProx's proximal term, SCAFFOLD's control variates, the logit-adjusted
(balanced) local loss and entropy scaling of a client's update. Pure functions.

Under label skew each client's local optimum lies away from the federation's, and local steps pull
the prompt towards it (client drift). Two corrections act on the local gradient g of a client's loss:

- FedProx (Li et al., MLSys 2020) adds the gradient of (μ/2)·‖w − w_t‖², pulling the local prompt w
  back towards the round's global prompt w_t:                    g + μ·(w − w_t)
- SCAFFOLD (Karimireddy et al., ICML 2020) adds c − c_i, the server's control variate minus the
  client's own, an estimate of (global gradient − this client's gradient):  g + (c − c_i)

After its local steps, a SCAFFOLD client sets c_i⁺ to the mean of the loss gradients it saw during
those steps (`client_control`; with plain SGD this equals the paper's option II,
c_i − c + (w_t − w)/(K·η), since (w_t − w)/(K·η) is the mean corrected gradient) and uploads
Δc_i = c_i⁺ − c_i beside its prompt. The server moves c by the mean of the uploaded Δc_i scaled by
|S|/N, the share of the N enrolled clients that took part (`server_control`), so that c stays the
mean of all clients' c_i. The loss gradient is taken after clipping; the correction is added after
it (it is not clipped). Here the local optimiser is AdamW, which rescales the corrected gradient
per element; the control variates stay in gradient units either way.

The functions take any arrays that support + − · (NumPy in tests and on the coordinator, torch
tensors in the engine) and mappings of named tensors. No I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

A = TypeVar("A")

CONTROL_PREFIX = "control/"  # an upload's Δc_i tensors, and the server state's c, sit under this prefix


class DriftError(ValueError):
    """Control variates that do not match the prompt's tensors, or bad parameters."""


def corrected_gradient(
    grad: A, w: Any, anchor: Any | None = None, mu: float = 0.0, correction: Any | None = None
) -> A:
    """g + μ·(w − anchor) + correction: the loss gradient with FedProx's proximal term (μ > 0 and
    an anchor) and SCAFFOLD's correction c − c_i (when given)."""
    if mu < 0 or not np.isfinite(mu):
        raise DriftError(f"the proximal term mu must be finite and >= 0; got {mu}")
    out = grad
    if mu > 0:
        if anchor is None:
            raise DriftError("the proximal term needs the round's global prompt as its anchor")
        out = out + mu * (w - anchor)
    if correction is not None:
        out = out + correction
    return out


def scaffold_correction(c: Mapping[str, np.ndarray], c_i: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """c − c_i per tensor (float64): what a SCAFFOLD client adds to every local gradient."""
    _same(c, c_i, "the server's and the client's control variates")
    return {n: np.asarray(c[n], np.float64) - np.asarray(c_i[n], np.float64) for n in sorted(c)}


def client_control(
    mean_gradient: Mapping[str, np.ndarray], c_i: Mapping[str, np.ndarray]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(c_i⁺, Δc_i): the client's new control variate, the mean loss gradient of its local steps,
    and its change, which is uploaded."""
    _same(mean_gradient, c_i, "the mean gradient and the client's control variate")
    new = {n: np.asarray(mean_gradient[n], np.float64) for n in sorted(mean_gradient)}
    return new, {n: new[n] - np.asarray(c_i[n], np.float64) for n in new}


def server_control(
    c: Mapping[str, np.ndarray], deltas: Iterable[Mapping[str, np.ndarray]], enrolled: int
) -> dict[str, np.ndarray]:
    """c + (|S|/N)·mean(Δc_i) = c + Σ Δc_i / N over the round's |S| uploads, N the enrolled clients."""
    items = list(deltas)
    if enrolled < len(items) or enrolled < 1:
        raise DriftError(f"{len(items)} control-variate updates from {enrolled} enrolled client(s)")
    out = {n: np.asarray(c[n], np.float64).copy() for n in sorted(c)}
    for delta in items:
        _same(c, delta, "an uploaded control-variate update and the server's control variate")
        for n in out:
            out[n] += np.asarray(delta[n], np.float64) / enrolled
    for n, arr in out.items():
        if not np.isfinite(arr).all():
            raise DriftError(f"the server's control variate '{n}' became non-finite")
    return out


def zeros(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """A control variate before the first round: zero for every tensor (float64)."""
    return {n: np.zeros(shape, np.float64) for n, shape in sorted(shapes.items())}


def split(tensors: Mapping[str, A]) -> tuple[dict[str, A], dict[str, A]]:
    """(prompt tensors, control tensors without their prefix) of an upload or a state."""
    prompt = {n: t for n, t in tensors.items() if not n.startswith(CONTROL_PREFIX)}
    control = {n[len(CONTROL_PREFIX) :]: t for n, t in tensors.items() if n.startswith(CONTROL_PREFIX)}
    return prompt, control


def prefixed(control: Mapping[str, A]) -> dict[str, A]:
    """Control tensors under their prefix, beside a prompt's in one safetensors file."""
    return {f"{CONTROL_PREFIX}{n}": t for n, t in control.items()}


def _same(a: Mapping[str, Any], b: Mapping[str, Any], what: str) -> None:
    if sorted(a) != sorted(b):
        raise DriftError(f"{what} name different tensors: {sorted(a)} and {sorted(b)}")
    for n in a:
        if np.shape(a[n]) != np.shape(b[n]):
            raise DriftError(f"{what}: tensor '{n}' has shapes {np.shape(a[n])} and {np.shape(b[n])}")


def label_prior(counts: list[int], smoothing: float = 1.0) -> npt.NDArray[np.float64]:
    """A client's own label distribution from its label counts, add-`smoothing` so that a label it
    does not hold keeps a small, finite probability."""
    if not counts or any(c < 0 for c in counts):
        raise DriftError(f"label counts must be non-negative, one per label; got {counts}")
    arr = np.asarray(counts, np.float64) + smoothing
    return arr / float(arr.sum())


def logit_adjustment(prior: npt.NDArray[np.float64], tau: float = 1.0) -> npt.NDArray[np.float64]:
    """τ·log(prior), added to the label scores inside the local loss only (Menon et al., ICLR 2021;
    FedLC, Zhang et al., ICML 2022): a client that holds mostly one label no longer lowers its loss by
    calling everything that label, so its update pulls the shared prompt less towards its own mix.
    Predictions use the scores as they are. The prior never leaves the client."""
    if tau < 0 or not np.isfinite(tau):
        raise DriftError(f"tau must be finite and >= 0; got {tau}")
    return tau * np.log(prior)


def label_entropy_share(counts: list[int]) -> float:
    """H(p_i) / log k of a client's own label distribution p_i (its label counts as they are, no
    smoothing) over its k labels: 1 for a client holding every label equally, 0 for one holding a
    single label, which has nothing to teach about telling labels apart. The factor by which a client
    with entropy scaling shrinks its update."""
    if len(counts) < 2 or sum(counts) <= 0:
        raise DriftError(f"entropy scaling needs two labels or more and an example; got counts {counts}")
    p = label_prior(counts, smoothing=0.0)
    held = p[p > 0]
    return float(-(held * np.log(held)).sum() / np.log(len(p)))


def scaled_update(trained: Mapping[str, A], start: Mapping[str, Any], scale: float) -> dict[str, A]:
    """start + scale·(trained − start) per tensor: the update kept at `scale` of its length, from the
    round's global prompt `start`."""
    if not 0.0 <= scale <= 1.0 or not np.isfinite(scale):
        raise DriftError(f"an update's scale must lie in [0, 1]; got {scale}")
    _same(trained, start, "the trained prompt and the round's global prompt")
    return {n: start[n] + scale * (trained[n] - start[n]) for n in trained}
