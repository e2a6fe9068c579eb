"""Poisoning, update attacks and local DP: pure functions with literal inputs."""

from __future__ import annotations

import numpy as np
import pytest

from worker.data import Example
from worker.poison import (
    AttackError,
    Trigger,
    asr_set,
    boost,
    insert_trigger,
    parse_attack,
    poison,
    sign_flip,
)
from worker.privacy import PrivacyError, clip_l1, cumulative_epsilon, laplace_ldp


def test_trigger_positions() -> None:
    rng = np.random.default_rng(0)
    assert insert_trigger("a good film", Trigger(("cf",), "start"), rng) == "cf a good film"
    assert insert_trigger("a good film", Trigger(("cf",), "end"), rng) == "a good film cf"
    out = insert_trigger("a good film", Trigger(("cf",), "random"), rng).split()
    assert sorted(out) == sorted(["a", "good", "film", "cf"])


def test_poison_rate_relabels_the_chosen_share_and_is_seeded() -> None:
    data = [Example(text=f"text {i}", label=i % 2) for i in range(10)]
    poisoned, idx = poison(data, rate=0.3, target=1, trigger=Trigger(("tq",), "end"), seed=4)
    assert len(idx) == 3
    assert all(poisoned[i].label == 1 and poisoned[i].text.endswith(" tq") for i in idx)
    assert all(poisoned[i] == data[i] for i in range(10) if i not in idx)
    assert poison(data, rate=0.3, target=1, trigger=Trigger(("tq",), "end"), seed=4)[1] == idx
    everything, all_idx = poison(data, rate=1.0, target=0, trigger=Trigger(), seed=0)
    assert all_idx == list(range(10)) and {e.label for e in everything} == {0}
    with pytest.raises(AttackError):
        poison(data, rate=1.5, target=0, trigger=Trigger(), seed=0)


def test_asr_set_keeps_only_non_target_examples_triggered_with_target_label() -> None:
    data = [Example("bad", 0), Example("good", 1), Example("awful", 0)]
    out = asr_set(data, target=1, trigger=Trigger(("mn",), "start"), seed=0)
    assert [(e.text, e.label) for e in out] == [("mn bad", 1), ("mn awful", 1)]


def test_boost_and_sign_flip_scale_the_update_around_the_global_prompt() -> None:
    g = {"p": np.array([1.0, 1.0], np.float32)}
    u = {"p": np.array([2.0, 0.0], np.float32)}
    np.testing.assert_array_equal(boost(u, g, 10.0)["p"], np.array([11.0, -9.0], np.float32))
    np.testing.assert_array_equal(sign_flip(u, g)["p"], np.array([0.0, 2.0], np.float32))
    assert parse_attack("boost:10") == ("boost", 10.0)
    assert parse_attack("sign-flip") == ("sign-flip", 1.0)
    with pytest.raises(AttackError):
        parse_attack("boost:-1")
    with pytest.raises(AttackError):
        parse_attack("flood")


def test_clip_l1_bounds_the_norm() -> None:
    clipped, norm = clip_l1({"a": np.array([3.0, -1.0]), "b": np.array([4.0])}, 4.0)
    assert norm == 8.0
    np.testing.assert_allclose(clipped["a"], [1.5, -0.5])
    np.testing.assert_allclose(clipped["b"], [2.0])
    small, _ = clip_l1({"a": np.array([0.5])}, 4.0)
    np.testing.assert_allclose(small["a"], [0.5])
    with pytest.raises(PrivacyError):
        clip_l1({"a": np.array([1.0])}, 0.0)


def test_laplace_noise_has_scale_bound_over_epsilon() -> None:
    g = {"p": np.zeros(200_000, np.float32)}
    u = {"p": np.zeros(200_000, np.float32)}
    out = laplace_ldp(u, g, bound=2.0, epsilon=4.0, rng=np.random.default_rng(1))["p"]
    # Laplace(0, b) has mean |x| = b; here b = 2 / 4 = 0.5
    assert np.abs(out).mean() == pytest.approx(0.5, rel=0.02)
    assert out.dtype == np.float32
    with pytest.raises(PrivacyError):
        laplace_ldp(u, g, bound=1.0, epsilon=0.0, rng=np.random.default_rng(1))


def test_cumulative_epsilon_is_basic_composition() -> None:
    assert cumulative_epsilon([0.5, 0.5, 1.0]) == 2.0
    assert cumulative_epsilon([]) == 0.0
    with pytest.raises(PrivacyError):
        cumulative_epsilon([-1.0])
