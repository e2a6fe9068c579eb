"""Server optimisers (FedAvgM, FedAdagrad, FedAdam, FedYogi) against hand-computed literal arrays.

Each test runs three rounds with known pseudo-gradients Δ (the round's average is x_t + Δ), so that
momentum and second moments carried from round to round change the result. Inputs are float64, so
the expected numbers, worked out by hand in the comments, hold to 1e-12.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from fedprompt.coordinator.logic.server_optim import (
    ServerOptimizerError,
    ServerStep,
    decode_state,
    encode_state,
    fedadagrad,
    fedadam,
    fedavgm,
    fedyogi,
    server_step,
)


def _run(optimizer: Callable[..., ServerStep], deltas: list[list[float]], **params: Any) -> list[ServerStep]:
    """Rounds from x0 = [0, 0]: each round's average is the current global plus that round's Δ."""
    x = {"p": np.zeros(2)}
    state: dict[str, np.ndarray] = {}
    steps = []
    for delta in deltas:
        average = {"p": x["p"] + np.array(delta)}
        step = optimizer(x, average, state, **params)
        x, state = step.tensors, step.state
        steps.append(step)
    return steps


def _close(got: np.ndarray, expected: list[float]) -> None:
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-15)


def test_fedavgm_accumulates_momentum_over_three_rounds() -> None:
    # lr 0.5, momentum 0.5. m = 0.5 m + Δ, x = x + 0.5 m.
    # R1: Δ = [1, -1]  m = [1, -1]          x = [0.5, -0.5]
    # R2: Δ = [1, 0]   m = [1.5, -0.5]      x = [1.25, -0.75]
    # R3: Δ = [0, 1]   m = [0.75, 0.75]     x = [1.625, -0.375]
    s1, s2, s3 = _run(fedavgm, [[1, -1], [1, 0], [0, 1]], lr=0.5, momentum=0.5)
    _close(s1.tensors["p"], [0.5, -0.5])
    _close(s2.tensors["p"], [1.25, -0.75])
    _close(s3.tensors["p"], [1.625, -0.375])
    _close(s3.state["m/p"], [0.75, 0.75])
    assert (s1.step, s2.step, s3.step) == (1, 2, 3)
    assert set(s3.state) == {"m/p", "step"}


def test_fedavgm_without_momentum_at_rate_one_is_fedavg() -> None:
    x = {"p": np.array([0.25, -1.5], np.float32)}
    average = {"p": np.array([0.75, 2.0], np.float32)}
    step = fedavgm(x, average, {}, lr=1.0, momentum=0.0)
    assert step.tensors["p"].dtype == np.float32
    np.testing.assert_array_equal(step.tensors["p"], average["p"])


def test_fedadagrad_sums_squared_pseudo_gradients() -> None:
    # lr 0.1, tau 1, beta1 0 (Flower's FedAdagrad): m = Δ, v = v + Δ², x = x + 0.1 m / (√v + 1).
    # R1: Δ = [3, -4]    v = [9, 16]     x = 0.1 [3/4, -4/5]               = [0.075, -0.08]
    # R2: Δ = [4, 3]     v = [25, 25]    x = x1 + 0.1 [4/6, 3/6]           = [0.075 + 1/15, -0.03]
    # R3: Δ = [12, -12]  v = [169, 169]  x = x2 + 0.1 [12/14, -12/14]
    s1, s2, s3 = _run(fedadagrad, [[3, -4], [4, 3], [12, -12]], lr=0.1, beta1=0.0, tau=1.0)
    _close(s1.tensors["p"], [0.075, -0.08])
    _close(s2.tensors["p"], [0.075 + 1 / 15, -0.03])
    _close(s3.tensors["p"], [0.075 + 1 / 15 + 1.2 / 14, -0.03 - 1.2 / 14])
    _close(s3.state["v/p"], [169, 169])
    _close(s3.state["m/p"], [12, -12])


def test_fedadagrad_with_momentum() -> None:
    # beta1 0.5: R1 m = 0.5 Δ = [1.5, -2], v = [9, 16], x = 0.1 [1.5/4, -2/5] = [0.0375, -0.04]
    # R2: Δ = [4, 3]: m = [0.75 + 2, -1 + 1.5] = [2.75, 0.5], v = [25, 25], x = x1 + 0.1 [2.75/6, 0.5/6]
    s1, s2 = _run(fedadagrad, [[3, -4], [4, 3]], lr=0.1, beta1=0.5, tau=1.0)
    _close(s1.tensors["p"], [0.0375, -0.04])
    _close(s2.tensors["p"], [0.0375 + 0.275 / 6, -0.04 + 0.05 / 6])


def test_fedadam_with_flowers_bias_corrected_step_size() -> None:
    # lr 0.1, beta1 0.5, beta2 0.75, tau 1; m = 0.5 m + 0.5 Δ, v = 0.75 v + 0.25 Δ²,
    # x = x + η_t m / (√v + 1) with η_t = 0.1 √(1 - 0.75^(t+1)) / (1 - 0.5^(t+1)).
    # R1: Δ = [2, -1]  m = [1, -0.5]       v = [1, 0.25]           η1 = 0.1 √0.4375 / 0.75
    # R2: Δ = [2, 1]   m = [1.5, 0.25]     v = [1.75, 0.4375]      η2 = 0.1 √0.578125 / 0.875
    # R3: Δ = [0, -3]  m = [0.75, -1.375]  v = [1.3125, 2.578125]  η3 = 0.1 √0.68359375 / 0.9375
    eta1 = 0.1 * math.sqrt(0.4375) / 0.75
    eta2 = 0.1 * math.sqrt(0.578125) / 0.875
    eta3 = 0.1 * math.sqrt(0.68359375) / 0.9375
    x1 = [eta1 * 1 / 2, eta1 * -0.5 / 1.5]
    x2 = [
        x1[0] + eta2 * 1.5 / (math.sqrt(1.75) + 1),
        x1[1] + eta2 * 0.25 / (math.sqrt(0.4375) + 1),
    ]
    x3 = [
        x2[0] + eta3 * 0.75 / (math.sqrt(1.3125) + 1),
        x2[1] + eta3 * -1.375 / (math.sqrt(2.578125) + 1),
    ]
    s1, s2, s3 = _run(fedadam, [[2, -1], [2, 1], [0, -3]], lr=0.1, beta1=0.5, beta2=0.75, tau=1.0)
    _close(s1.tensors["p"], x1)
    _close(s2.tensors["p"], x2)
    _close(s3.tensors["p"], x3)
    _close(s3.state["m/p"], [0.75, -1.375])
    _close(s3.state["v/p"], [1.3125, 2.578125])
    assert s3.step == 3


def test_fedyogi_second_moment_moves_by_the_sign_of_v_minus_delta_squared() -> None:
    # lr 0.1, beta1 0.5, beta2 0.75, tau 1; v = v - 0.25 Δ² sign(v - Δ²), no bias correction.
    # R1: Δ = [2, -1]  v0 = 0: v = 0.25 Δ² = [1, 0.25]; m = [1, -0.5]; x = 0.1 [1/2, -0.5/1.5]
    # R2: Δ = [2, 1]   v - Δ² = [-3, -0.75] < 0: v = [1 + 1, 0.25 + 0.25] = [2, 0.5]; m = [1.5, 0.25]
    # R3: Δ = [1, 0]   v - Δ² = [1, 0.5] > 0:    v = [2 - 0.25, 0.5 - 0] = [1.75, 0.5]; m = [1.25, 0.125]
    x1 = [0.05, -0.1 / 3]
    x2 = [x1[0] + 0.15 / (math.sqrt(2) + 1), x1[1] + 0.025 / (math.sqrt(0.5) + 1)]
    x3 = [x2[0] + 0.125 / (math.sqrt(1.75) + 1), x2[1] + 0.0125 / (math.sqrt(0.5) + 1)]
    s1, s2, s3 = _run(fedyogi, [[2, -1], [2, 1], [1, 0]], lr=0.1, beta1=0.5, beta2=0.75, tau=1.0)
    _close(s1.tensors["p"], x1)
    _close(s2.tensors["p"], x2)
    _close(s3.tensors["p"], x3)
    _close(s2.state["v/p"], [2, 0.5])
    _close(s3.state["v/p"], [1.75, 0.5])
    _close(s3.state["m/p"], [1.25, 0.125])


def test_several_tensors_float32_in_float32_out_and_state_round_trips() -> None:
    x = {"a": np.zeros((2, 2), np.float32), "b": np.ones(3, np.float32)}
    average = {"a": np.full((2, 2), 0.5, np.float32), "b": np.full(3, 1.5, np.float32)}
    params = {"lr": 0.1, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3}
    step = server_step("fedadam", x, average, {}, params)
    assert {n: (t.dtype, t.shape) for n, t in step.tensors.items()} == {
        "a": (np.float32, (2, 2)),
        "b": (np.float32, (3,)),
    }
    assert sorted(step.state) == ["m/a", "m/b", "step", "v/a", "v/b"]
    again = decode_state(encode_state(step.state))
    assert sorted(again) == sorted(step.state)
    for name, arr in step.state.items():
        np.testing.assert_array_equal(again[name], arr)
        assert again[name].dtype == arr.dtype
    # the decoded state continues exactly as the in-memory one
    one = server_step("fedadam", step.tensors, average, step.state, params)
    two = server_step("fedadam", step.tensors, average, again, params)
    for name in x:
        np.testing.assert_array_equal(one.tensors[name], two.tensors[name])


@pytest.mark.parametrize(
    "x, average, state, message",
    [
        ({"p": np.zeros(2)}, {"q": np.zeros(2)}, {}, "tensors"),
        ({"p": np.zeros(2)}, {"p": np.zeros(3)}, {}, "shape"),
        ({"p": np.zeros(2)}, {"p": np.zeros(2)}, {"m/p": np.zeros(2), "step": np.array(1)}, "state holds"),
        (
            {"p": np.zeros(2)},
            {"p": np.zeros(2)},
            {"m/p": np.zeros(3), "v/p": np.zeros(2), "step": np.array(1)},
            "shape",
        ),
    ],
)
def test_mismatched_tensors_or_state_are_refused(
    x: dict[str, np.ndarray], average: dict[str, np.ndarray], state: dict[str, np.ndarray], message: str
) -> None:
    with pytest.raises(ServerOptimizerError, match=message):
        fedyogi(x, average, state, lr=0.1, beta1=0.9, beta2=0.99, tau=1e-3)


def test_unknown_optimiser_and_parameters_are_refused() -> None:
    x = {"p": np.zeros(2)}
    with pytest.raises(ServerOptimizerError, match="unknown server optimiser"):
        server_step("sgd", x, x, {}, {"lr": 1.0})
    with pytest.raises(ServerOptimizerError, match="bad parameters"):
        server_step("fedavgm", x, x, {}, {"lr": 1.0, "momentum": 0.9, "beta2": 0.5})
    with pytest.raises(ServerOptimizerError, match="momentum"):
        server_step("fedavgm", x, x, {}, {"lr": 1.0, "momentum": 1.0})
