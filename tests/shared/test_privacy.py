"""Local differential privacy, pure functions with literal inputs: clipping, Laplace and Gaussian noise
calibrated to the clipped update's sensitivity (2 × the bound), the Gaussian mechanism's calibration and
composition by the PRV accountant, seeded noise for simulations."""

from __future__ import annotations

import math

import numpy as np
import pytest
from fedprompt.shared.privacy import (
    SENSITIVITY_FACTOR,
    PrivacyError,
    client_noise_seed,
    clip_l1,
    clip_l2,
    cumulative_epsilon,
    gaussian_epsilon,
    gaussian_ldp,
    gaussian_noise_multiplier,
    gaussian_std,
    l1_norm,
    l2_norm,
    laplace_ldp,
    laplace_scale,
    ldp_rng,
    spent_epsilon,
    uncalibrated_epsilon,
    update_delta,
)
from fedprompt.shared.spec_options import PrivacySpec
from pydantic import ValidationError


def test_clip_l1_bounds_the_norm() -> None:
    clipped, norm = clip_l1({"a": np.array([3.0, -1.0]), "b": np.array([4.0])}, 4.0)
    assert norm == 8.0
    np.testing.assert_allclose(clipped["a"], [1.5, -0.5])
    np.testing.assert_allclose(clipped["b"], [2.0])
    small, _ = clip_l1({"a": np.array([0.5])}, 4.0)
    np.testing.assert_allclose(small["a"], [0.5])
    with pytest.raises(PrivacyError):
        clip_l1({"a": np.array([1.0])}, 0.0)


def test_update_norms_span_all_tensors() -> None:
    new = {"a": np.array([1.0, 1.0], np.float32), "b": np.array([[2.0]], np.float32)}
    old = {"a": np.array([4.0, -3.0], np.float32), "b": np.array([[2.0]], np.float32)}
    delta = update_delta(new, old)
    np.testing.assert_array_equal(delta["a"], [-3.0, 4.0])
    assert delta["a"].dtype == np.float64
    assert l1_norm(delta) == 7.0
    assert l2_norm(delta) == 5.0
    assert l1_norm({"a": np.zeros(3)}) == l2_norm({"a": np.zeros(3)}) == 0.0


def test_laplace_noise_has_scale_twice_the_bound_over_epsilon() -> None:
    g = {"p": np.zeros(200_000, np.float32)}
    u = {"p": np.zeros(200_000, np.float32)}
    out = laplace_ldp(u, g, bound=2.0, epsilon=4.0, rng=np.random.default_rng(1))["p"]
    # Laplace(0, b) has mean |x| = b; here b = sensitivity / ε = 2 × 2 / 4 = 1
    assert np.abs(out).mean() == pytest.approx(1.0, rel=0.02)
    assert laplace_scale(2.0, 4.0) == 1.0 and SENSITIVITY_FACTOR == 2.0
    assert out.dtype == np.float32
    with pytest.raises(PrivacyError):
        laplace_ldp(u, g, bound=1.0, epsilon=0.0, rng=np.random.default_rng(1))


def test_cumulative_epsilon_is_basic_composition() -> None:
    assert cumulative_epsilon([0.5, 0.5, 1.0]) == 2.0
    assert cumulative_epsilon([]) == 0.0
    with pytest.raises(PrivacyError):
        cumulative_epsilon([-1.0])


def test_laplace_noise_mean_absolute_deviation_is_twice_the_bound_over_epsilon_over_100k_draws() -> None:
    zeros = {"p": np.zeros(100_000, np.float32)}
    noisy = laplace_ldp(zeros, zeros, bound=3.0, epsilon=0.5, rng=np.random.default_rng(7))["p"].astype(
        np.float64
    )
    mad = np.abs(noisy - noisy.mean()).mean()
    assert mad == pytest.approx(2 * 3.0 / 0.5, rel=0.05)


def test_two_clipped_updates_differ_by_up_to_twice_the_bound() -> None:
    # why the sensitivity is 2 × the bound: an update and its opposite, both within the bound
    up, _ = clip_l1({"p": np.array([10.0, 0.0])}, 1.0)
    down, _ = clip_l1({"p": np.array([-10.0, 0.0])}, 1.0)
    assert np.abs(up["p"] - down["p"]).sum() == SENSITIVITY_FACTOR * 1.0
    up2, _ = clip_l2({"p": np.array([3.0, 4.0])}, 1.0)
    down2, _ = clip_l2({"p": np.array([-3.0, -4.0])}, 1.0)
    assert np.linalg.norm(up2["p"] - down2["p"]) == pytest.approx(SENSITIVITY_FACTOR * 1.0)


def test_ldp_clips_the_update_before_adding_noise() -> None:
    g = {"p": np.array([1.0, 1.0, 1.0], np.float32)}
    u = {"p": np.array([101.0, 1.0, -99.0], np.float32)}  # L1 of the update: 200
    out = laplace_ldp(u, g, bound=2.0, epsilon=1e6, rng=np.random.default_rng(0))["p"]
    np.testing.assert_allclose(out, [2.0, 1.0, 0.0], atol=1e-4)  # clipped to L1 = 2, noise scale 4e-6


def test_clip_l2_bounds_the_euclidean_norm_over_all_tensors() -> None:
    clipped, norm = clip_l2({"a": np.array([3.0, 0.0]), "b": np.array([4.0])}, 2.5)
    assert norm == 5.0
    np.testing.assert_allclose(clipped["a"], [1.5, 0.0])
    np.testing.assert_allclose(clipped["b"], [2.0])
    small, _ = clip_l2({"a": np.array([0.3, 0.4])}, 1.0)
    np.testing.assert_allclose(small["a"], [0.3, 0.4])
    with pytest.raises(PrivacyError):
        clip_l2({"a": np.array([1.0])}, -1.0)


def test_gaussian_noise_has_std_multiplier_times_twice_the_bound_around_the_clipped_update() -> None:
    g = {"p": np.zeros(200_000, np.float32)}
    u = {"p": np.zeros(200_000, np.float32)}
    u["p"][0] = 1000.0  # an update of L2 norm 1000, clipped to 2
    out = gaussian_ldp(u, g, bound=2.0, noise_multiplier=0.5, rng=np.random.default_rng(3))["p"]
    assert out.dtype == np.float32
    assert out[1:].astype(np.float64).std() == pytest.approx(2.0, rel=0.02)  # 0.5 × sensitivity 2 × 2
    assert gaussian_std(2.0, 0.5) == 2.0
    assert abs(out[1:].astype(np.float64).mean()) < 0.02
    assert 2.0 - 5 * 2.0 < out[0] < 2.0 + 5 * 2.0  # the clipped 2.0 plus one N(0, 2²) draw
    with pytest.raises(PrivacyError):
        gaussian_ldp(u, g, bound=2.0, noise_multiplier=0.0, rng=np.random.default_rng(1))


def test_gaussian_calibration_is_tight_and_beats_the_classical_bound() -> None:
    sigma = gaussian_noise_multiplier(1.0, 1e-5)
    # the exact (analytic) Gaussian mechanism needs σ ≈ 3.73 for (1, 1e-5)-DP (Balle & Wang, 2018)
    assert sigma == pytest.approx(3.73, abs=0.02)
    assert gaussian_epsilon(sigma, 1e-5, 1, 1.0) <= 1.0  # what the accountant certifies
    assert gaussian_epsilon(sigma * 0.98, 1e-5, 1, 1.0) > 1.0  # and no looser than needed
    # the classical σ = sqrt(2 ln(1.25/δ)) / ε (Dwork & Roth, ε < 1) is larger
    assert gaussian_noise_multiplier(0.5, 1e-5) < math.sqrt(2 * math.log(1.25 / 1e-5)) / 0.5
    assert gaussian_noise_multiplier(10.0, 1e-5) < sigma < gaussian_noise_multiplier(0.5, 1e-5)
    with pytest.raises(PrivacyError):
        gaussian_noise_multiplier(1000.0, 1e-5)
    with pytest.raises(PrivacyError):
        gaussian_noise_multiplier(1.0, 0.5)


def test_spent_epsilon_composes_per_mechanism() -> None:
    assert spent_epsilon("laplace", 0.5, None, 4) == 2.0  # basic composition
    assert spent_epsilon("gaussian", 1.0, 1e-5, 0) == 0.0
    one = spent_epsilon("gaussian", 1.0, 1e-5, 1)
    ten = spent_epsilon("gaussian", 1.0, 1e-5, 10)
    assert one == pytest.approx(1.0, abs=0.01)
    assert one < spent_epsilon("gaussian", 1.0, 1e-5, 2) < ten < 10 * one  # tighter than basic composition
    with pytest.raises(PrivacyError):
        spent_epsilon("gaussian", 1.0, None, 3)
    with pytest.raises(PrivacyError):
        spent_epsilon("exponential", 1.0, None, 3)
    with pytest.raises(PrivacyError):
        spent_epsilon("laplace", 1.0, None, -1)


def test_builds_calibrated_to_the_bound_guaranteed_twice_laplace_epsilon_and_less_for_gaussian() -> None:
    assert uncalibrated_epsilon("laplace", 1000.0, None, 2) == 4000.0  # 2ε per release, basic composition
    assert uncalibrated_epsilon("laplace", 1.0, None, 0) == 0.0
    one = uncalibrated_epsilon("gaussian", 1.0, 1e-5, 1)
    # std σ(1, 1e-5)·bound is a noise multiplier of σ/2 against the sensitivity 2·bound
    assert one == pytest.approx(gaussian_epsilon(gaussian_noise_multiplier(1.0, 1e-5) / 2, 1e-5, 1, 2.0))
    assert 1.0 < one < 4.0
    assert uncalibrated_epsilon("gaussian", 1.0, 1e-5, 2) > one
    with pytest.raises(PrivacyError):
        uncalibrated_epsilon("gaussian", 1.0, None, 1)


def test_seeded_noise_repeats_per_round_and_os_entropy_does_not() -> None:
    zeros = {"p": np.zeros(64, np.float32)}

    def release(seed: int | None, round_number: int) -> np.ndarray:
        return laplace_ldp(zeros, zeros, bound=1.0, epsilon=1.0, rng=ldp_rng(seed, round_number))["p"]

    np.testing.assert_array_equal(release(11, 3), release(11, 3))  # a simulation's run, repeated
    assert not np.array_equal(release(11, 3), release(11, 4))  # another round: other noise
    assert not np.array_equal(release(11, 3), release(12, 3))  # another client: other noise
    assert not np.array_equal(release(None, 3), release(None, 3))  # production: fresh OS entropy
    seeds = {client_noise_seed(0, i) for i in range(10)} | {client_noise_seed(1, i) for i in range(10)}
    assert len(seeds) == 20 and all(0 <= s < 2**63 for s in seeds)
    assert client_noise_seed(0, 3) == client_noise_seed(0, 3)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"mechanism": "gaussian", "epsilon": 1.0, "clip": 1.0}, "needs delta"),
        ({"mechanism": "gaussian", "epsilon": 500.0, "delta": 1e-5, "clip": 1.0}, "epsilon in"),
        ({"mechanism": "laplace", "epsilon": 1.0, "delta": 1e-5, "clip": 1.0}, "gaussian mechanism only"),
        ({"mechanism": "gaussian", "epsilon": 1.0, "delta": 0.5, "clip": 1.0}, "less than or equal"),
    ],
)
def test_privacy_spec_refuses_settings_that_cannot_work(fields: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        PrivacySpec.model_validate(fields)
    assert PrivacySpec.model_validate({"mechanism": "gaussian", "epsilon": 1.0, "delta": 1e-5, "clip": 1.0})
