"""Server-side optimisers of "Adaptive Federated Optimization" (Reddi et al., ICLR 2021): pure functions.

Each round the aggregation rule (FedAvg or a robust rule) turns the clients' prompts into their
average. Plain FedAvg takes that average as the next global prompt. A server optimiser instead treats
the pseudo-gradient Δ = average − x_t (x_t: the round's base prompt) as a gradient step and moves
x_t by its own rule, with state (momentum, second moments) carried from round to round:

- FedAvgM (Hsu et al., 2019):  m = β·m + Δ;  x = x + η·m
- FedAdagrad:                   m = β1·m + (1−β1)·Δ;  v = v + Δ²;  x = x + η·m / (√v + τ)
- FedAdam:                      m as above;  v = β2·v + (1−β2)·Δ²;  x = x + η_t·m / (√v + τ)
- FedYogi:                      m as above;  v = v − (1−β2)·Δ²·sign(v − Δ²);  x = x + η·m / (√v + τ)

The rules are Flower's strategies of the same names (flwr FedAvgM, FedAdagrad, FedAdam, FedYogi),
including their choices where the paper leaves room: m and v start at zero (not at τ²), FedAdagrad's
momentum β1 is 0 unless set, and only FedAdam corrects the bias of its moments, through its step size
η_t (see `fedadam`); FedAdagrad and FedYogi do not. FedAvgM with β = 0 and η = 1 is FedAvg.

Every rule is registered under its ServerOptimizer name (`register`, as the aggregation rules are),
with keyword-only hyper-parameters named as in its SERVER_OPTIMIZER_DEFAULTS row (shared/vocab.py): a
new optimiser is its name and defaults there and its rule here. Every rule takes the global tensors x_t,
the average and the state after the previous step (empty before the first) and returns the new global
tensors, cast back to x_t's dtype, and the new state: float64 arrays named ``m/<tensor>`` and ``v/<tensor>`` plus ``step``, the number of steps
taken (a 0-d int64 array; step t is round t's). Arithmetic is float64. No I/O except `encode_state`
and `decode_state`, which turn a state into safetensors bytes and back for the database.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from fedprompt.coordinator.logic.aggregation import AggregationError
from fedprompt.shared.vocab import ServerOptimizer
from safetensors.numpy import load as _st_load
from safetensors.numpy import save as _st_save

Tensors = Mapping[str, np.ndarray]
State = Mapping[str, np.ndarray]


class ServerOptimizerError(AggregationError):
    """The optimiser cannot step: mismatched tensors, a state of another shape, bad parameters."""


@dataclass(frozen=True)
class ServerStep:
    """The new global tensors (x_t's dtype) and the optimiser's state after this step (float64)."""

    tensors: dict[str, np.ndarray]
    state: dict[str, np.ndarray]

    @property
    def step(self) -> int:
        return int(self.state["step"])


def _prepare(
    x: Tensors, average: Tensors, state: State, moments: tuple[str, ...]
) -> tuple[dict[str, np.ndarray], dict[str, dict[str, np.ndarray]], int]:
    """Δ per tensor (float64), the previous moments (zeros before the first step) and this step's t."""
    if sorted(x) != sorted(average):
        raise ServerOptimizerError(
            f"the average has tensors {sorted(average)}, the global prompt {sorted(x)}"
        )
    delta: dict[str, np.ndarray] = {}
    for name in sorted(x):
        if np.shape(average[name]) != np.shape(x[name]):
            raise ServerOptimizerError(
                f"tensor '{name}': the average has shape {np.shape(average[name])}, "
                f"the global prompt {np.shape(x[name])}"
            )
        delta[name] = np.asarray(average[name], np.float64) - np.asarray(x[name], np.float64)
    previous: dict[str, dict[str, np.ndarray]] = {}
    if not state:
        for moment in moments:
            previous[moment] = {name: np.zeros_like(d) for name, d in delta.items()}
        return delta, previous, 1
    expected = {f"{moment}/{name}" for moment in moments for name in delta} | {"step"}
    if set(state) != expected:
        raise ServerOptimizerError(f"the optimiser state holds {sorted(state)}, expected {sorted(expected)}")
    for moment in moments:
        previous[moment] = {}
        for name, d in delta.items():
            held = np.asarray(state[f"{moment}/{name}"], np.float64)
            if held.shape != d.shape:
                raise ServerOptimizerError(
                    f"the optimiser state's '{moment}/{name}' has shape {held.shape}, the tensor {d.shape}"
                )
            previous[moment][name] = held
    step = np.asarray(state["step"])
    if step.size != 1 or step.dtype.kind not in "iu" or int(step.item()) < 1:
        raise ServerOptimizerError(f"the optimiser state's step is {step!r}, expected a count of steps")
    return delta, previous, int(step.item()) + 1


def _finish(
    x: Tensors, moved: Mapping[str, np.ndarray], moments: Mapping[str, Mapping[str, np.ndarray]], t: int
) -> ServerStep:
    tensors = {name: moved[name].astype(np.asarray(x[name]).dtype) for name in sorted(moved)}
    for name, arr in tensors.items():
        if not np.isfinite(arr).all():
            raise ServerOptimizerError(f"the server step made tensor '{name}' non-finite")
    state = {f"{moment}/{name}": arr for moment, arrs in moments.items() for name, arr in arrs.items()}
    state["step"] = np.array(t, dtype=np.int64)
    return ServerStep(tensors, state)


def _check_rates(**values: float) -> None:
    for key, value in values.items():
        if not np.isfinite(value):
            raise ServerOptimizerError(f"{key} must be finite; got {value}")
    if values["lr"] <= 0:
        raise ServerOptimizerError(f"lr must be positive; got {values['lr']}")
    for key in ("momentum", "beta1", "beta2"):
        if key in values and not 0.0 <= values[key] < 1.0:
            raise ServerOptimizerError(f"{key} must be in [0, 1); got {values[key]}")
    if "tau" in values and values["tau"] <= 0:
        raise ServerOptimizerError(f"tau must be positive; got {values['tau']}")


Rule = Callable[..., ServerStep]
_OPTIMIZERS: dict[str, Rule] = {}


def register(name: str) -> Callable[[Rule], Rule]:
    """Register a server optimiser's update rule under the name a ServerOptimizerSpec gives it."""

    def deco(fn: Rule) -> Rule:
        _OPTIMIZERS[name] = fn
        return fn

    return deco


def available_optimizers() -> list[str]:
    """Names of the registered server optimisers."""
    return sorted(_OPTIMIZERS)


def hyperparameters(name: str) -> list[str]:
    """The hyper-parameters the named optimiser's rule takes (its keyword-only parameters)."""
    rule = _OPTIMIZERS[name]
    return [p.name for p in inspect.signature(rule).parameters.values() if p.kind is p.KEYWORD_ONLY]


@register(ServerOptimizer.FEDAVG)
def fedavg(x: Tensors, average: Tensors, state: State) -> ServerStep:
    """No server optimiser: the average is the next global prompt (x = x + Δ), and no moments are kept.
    (The round cycle does not call it: a fedavg round records no server step.)"""
    _, _, t = _prepare(x, average, state, ())
    moved = {name: np.asarray(average[name], np.float64) for name in x}
    return _finish(x, moved, {}, t)


@register(ServerOptimizer.FEDAVGM)
def fedavgm(x: Tensors, average: Tensors, state: State, *, lr: float, momentum: float) -> ServerStep:
    """FedAvgM, Flower's `FedAvgM(server_learning_rate=lr, server_momentum=momentum)`:
    m = momentum·m + Δ (m = Δ on the first step), x = x + lr·m."""
    _check_rates(lr=lr, momentum=momentum)
    delta, prev, t = _prepare(x, average, state, ("m",))
    m = {name: momentum * prev["m"][name] + d for name, d in delta.items()}
    moved = {name: np.asarray(x[name], np.float64) + lr * m[name] for name in delta}
    return _finish(x, moved, {"m": m}, t)


def _adaptive(
    x: Tensors,
    average: Tensors,
    state: State,
    *,
    lr: float,
    beta1: float,
    tau: float,
    second_moment: Callable[[np.ndarray, np.ndarray], np.ndarray],
    step_size: Callable[[int], float],
) -> ServerStep:
    delta, prev, t = _prepare(x, average, state, ("m", "v"))
    m = {name: beta1 * prev["m"][name] + (1.0 - beta1) * d for name, d in delta.items()}
    v = {name: second_moment(prev["v"][name], d) for name, d in delta.items()}
    eta = step_size(t)
    moved = {
        name: np.asarray(x[name], np.float64) + eta * m[name] / (np.sqrt(v[name]) + tau) for name in delta
    }
    return _finish(x, moved, {"m": m, "v": v}, t)


@register(ServerOptimizer.FEDADAGRAD)
def fedadagrad(
    x: Tensors, average: Tensors, state: State, *, lr: float, beta1: float, tau: float
) -> ServerStep:
    """FedAdagrad: m = β1·m + (1−β1)·Δ, v = v + Δ², x = x + lr·m / (√v + τ). No bias correction.
    Flower's FedAdagrad fixes β1 = 0 (m = Δ), the default here too."""
    _check_rates(lr=lr, beta1=beta1, tau=tau)
    return _adaptive(
        x,
        average,
        state,
        lr=lr,
        beta1=beta1,
        tau=tau,
        second_moment=lambda v, d: v + d * d,
        step_size=lambda _t: lr,
    )


@register(ServerOptimizer.FEDADAM)
def fedadam(
    x: Tensors, average: Tensors, state: State, *, lr: float, beta1: float, beta2: float, tau: float
) -> ServerStep:
    """FedAdam: m = β1·m + (1−β1)·Δ, v = β2·v + (1−β2)·Δ², x = x + η_t·m / (√v + τ).

    Bias-corrected as in Flower's FedAdam today (`flwr.server.strategy` and `flwr.serverapp.strategy`;
    its first versions had no correction): the step size is
    η_t = lr·√(1 − β2^(t+1)) / (1 − β1^(t+1)) at step t = 1, 2, … (Flower's `server_round`), i.e.
    Kingma & Ba's α_t with the exponent one higher than theirs; m and v themselves are not corrected,
    and τ is added to √v unscaled."""
    _check_rates(lr=lr, beta1=beta1, beta2=beta2, tau=tau)
    return _adaptive(
        x,
        average,
        state,
        lr=lr,
        beta1=beta1,
        tau=tau,
        second_moment=lambda v, d: beta2 * v + (1.0 - beta2) * d * d,
        step_size=lambda t: lr * np.sqrt(1.0 - beta2 ** (t + 1.0)) / (1.0 - beta1 ** (t + 1.0)),
    )


@register(ServerOptimizer.FEDYOGI)
def fedyogi(
    x: Tensors, average: Tensors, state: State, *, lr: float, beta1: float, beta2: float, tau: float
) -> ServerStep:
    """FedYogi: m = β1·m + (1−β1)·Δ, v = v − (1−β2)·Δ²·sign(v − Δ²), x = x + lr·m / (√v + τ).
    No bias correction (as Flower's FedYogi); v starts at zero, so v = (1−β2)·Δ² after the first step."""
    _check_rates(lr=lr, beta1=beta1, beta2=beta2, tau=tau)
    return _adaptive(
        x,
        average,
        state,
        lr=lr,
        beta1=beta1,
        tau=tau,
        second_moment=lambda v, d: v - (1.0 - beta2) * d * d * np.sign(v - d * d),
        step_size=lambda _t: lr,
    )


def server_step(
    name: str, x: Tensors, average: Tensors, state: State, params: Mapping[str, Any]
) -> ServerStep:
    """Run the named optimiser with its hyper-parameters (every one it takes, none it does not)."""
    try:
        optimizer = _OPTIMIZERS[name]
    except KeyError:
        raise ServerOptimizerError(
            f"unknown server optimiser '{name}'; available: {available_optimizers()}"
        ) from None
    takes = hyperparameters(name)
    if sorted(params) != sorted(takes):
        raise ServerOptimizerError(
            f"bad parameters for server optimiser '{name}': it takes {takes}, got {sorted(params)}"
        )
    return optimizer(x, average, state, **dict(params))


def distance(a: Tensors, b: Tensors) -> float:
    """The L2 distance between two sets of the same named tensors (float64)."""
    total = sum(
        float(np.sum((np.asarray(a[n], np.float64) - np.asarray(b[n], np.float64)) ** 2)) for n in sorted(a)
    )
    return float(np.sqrt(total))


def encode_state(state: State, metadata: Mapping[str, str] | None = None) -> bytes:
    """A state as safetensors bytes (float64 moments and the int64 step kept as they are)."""
    # np.asarray, not np.ascontiguousarray: that one turns the 0-d step into shape (1,)
    arrays = {k: np.asarray(v, order="C") for k, v in state.items()}
    return _st_save(arrays, metadata=dict(metadata or {}))


def decode_state(blob: bytes) -> dict[str, np.ndarray]:
    """The state `encode_state` wrote."""
    return dict(_st_load(bytes(blob)))
