"""Robust aggregation rules with literal arrays, including their breakdown cases."""

from __future__ import annotations

import numpy as np
import pytest
from fedprompt.coordinator.logic.aggregation import AggregationError, aggregate, available_rules, check_params


def ups(*rows: list[float], weights: list[float] | None = None) -> list[tuple[dict[str, np.ndarray], float]]:
    weights = weights or [1.0] * len(rows)
    return [({"p": np.array(r, dtype=np.float32)}, w) for r, w in zip(rows, weights, strict=True)]


def test_all_rules_are_registered() -> None:
    assert {"fedavg", "median", "trimmed_mean", "krum", "multi_krum", "norm_bound", "stats_filter"} <= set(
        available_rules()
    )


def test_median_ignores_f_of_n_adversarial_rows() -> None:
    honest = [[1.0, 2.0], [1.1, 2.1], [0.9, 1.9]]
    evil = [[1e6, -1e6], [1e6, -1e6]]  # 2 of 5: fewer than half
    out = aggregate("median", ups(*honest, *evil)).tensors["p"]
    np.testing.assert_allclose(out, [1.1, 1.9], rtol=1e-6)
    # With a majority of adversarial rows the median breaks down, as it must.
    broken = aggregate("median", ups(*honest[:2], *evil, [1e6, -1e6])).tensors["p"]
    assert broken[0] == np.float32(1e6)


def test_fedavg_is_dragged_by_one_boosted_update_but_median_is_not() -> None:
    rows = [[1.0], [1.0], [1.0], [1.0], [101.0]]
    assert aggregate("fedavg", ups(*rows)).tensors["p"][0] == pytest.approx(21.0)
    assert aggregate("median", ups(*rows)).tensors["p"][0] == 1.0


def test_trimmed_mean_drops_beta_n_from_each_end() -> None:
    rows = [[0.0], [1.0], [2.0], [3.0], [100.0]]
    assert aggregate("trimmed_mean", ups(*rows), params={"beta": 0.2}).tensors["p"][0] == pytest.approx(2.0)
    assert aggregate("trimmed_mean", ups(*rows), params={"beta": 0.0}).tensors["p"][0] == pytest.approx(21.2)
    with pytest.raises(AggregationError, match="beta"):
        aggregate("trimmed_mean", ups(*rows), params={"beta": 0.5})


def test_krum_picks_the_honest_cluster() -> None:
    honest = [[0.0, 0.0], [0.1, 0.0], [0.0, 0.1], [0.1, 0.1], [0.05, 0.05]]
    evil = [[10.0, 10.0], [10.2, 9.9]]
    result = aggregate("krum", ups(*honest, *evil), params={"f": 2})
    assert np.linalg.norm(result.tensors["p"]) < 0.2
    assert set(result.notes) >= {5, 6} and "not selected" in result.notes[5]


def test_multi_krum_averages_the_m_best() -> None:
    honest = [[1.0], [1.2], [0.8], [1.1], [0.9]]
    result = aggregate("multi_krum", ups(*honest, [50.0], [60.0]), params={"f": 2, "m": 3})
    assert 0.8 <= result.tensors["p"][0] <= 1.2
    assert len(result.notes) == 4  # 7 updates, 3 kept
    with pytest.raises(AggregationError, match="2f \\+ 3"):
        aggregate("krum", ups([1.0], [2.0], [3.0]), params={"f": 1})


def test_norm_bound_clips_distance_to_the_global_prompt() -> None:
    g = {"p": np.array([0.0, 0.0], dtype=np.float32)}
    result = aggregate("norm_bound", ups([3.0, 4.0], [0.3, 0.4]), params={"bound": 1.0}, global_tensors=g)
    # first clipped from norm 5 to 1 -> [0.6, 0.8]; second untouched; mean -> [0.45, 0.6]
    np.testing.assert_allclose(result.tensors["p"], [0.45, 0.6], rtol=1e-6)
    assert list(result.notes) == [0] and "clipped from 5" in result.notes[0]
    with pytest.raises(AggregationError, match="global prompt"):
        aggregate("norm_bound", ups([1.0]), params={"bound": 1.0})


def test_stats_filter_rejects_updates_with_outlying_mean_or_std() -> None:
    honest = [[0.0, 1.0, -1.0, 0.5], [0.1, 0.9, -1.1, 0.4], [-0.1, 1.1, -0.9, 0.6], [0.05, 1.0, -1.0, 0.45]]
    boosted = [[0.0, 10.0, -10.0, 5.0]]  # same mean sign, std ten times larger
    result = aggregate("stats_filter", ups(*honest, *boosted), params={"k": 3.0})
    assert list(result.notes) == [4] and "std" in result.notes[4]
    expected = aggregate("fedavg", ups(*honest)).tensors["p"]
    np.testing.assert_array_equal(result.tensors["p"], expected)


@pytest.mark.parametrize(
    "rule, params", [("median", {}), ("trimmed_mean", {"beta": 0.2}), ("multi_krum", {"f": 1})]
)
def test_robust_rules_do_not_depend_on_arrival_order(rule: str, params: dict) -> None:
    rng = np.random.default_rng(3)
    rows = [rng.standard_normal(6).tolist() for _ in range(6)]
    ref = aggregate(rule, ups(*rows), params=params).tensors["p"]
    np.testing.assert_array_equal(aggregate(rule, ups(*reversed(rows)), params=params).tensors["p"], ref)


def test_check_params_refuses_unknown_names_and_bad_values() -> None:
    check_params("trimmed_mean", {"beta": 0.2})
    check_params("multi_krum", {"f": 2, "m": 3})
    with pytest.raises(AggregationError, match="no parameter"):
        check_params("median", {"beta": 0.1})
    with pytest.raises(AggregationError, match="beta"):
        check_params("trimmed_mean", {"beta": 0.7})
    with pytest.raises(AggregationError, match="unknown aggregation rule"):
        check_params("mean-ish", {})
