"""Mode async's pure rules (coordinator/logic/buffered.py) against literal values."""

from __future__ import annotations

import numpy as np
import pytest
from fedprompt.coordinator.logic import buffered


def test_staleness_weights_are_one_over_the_root_of_one_plus_tau() -> None:
    assert buffered.staleness_weight(0) == 1.0
    assert buffered.staleness_weight(3) == 0.5
    assert buffered.staleness_weight(8) == pytest.approx(1 / 3)
    assert buffered.staleness_weight(1) == pytest.approx(0.7071067811865476)
    with pytest.raises(ValueError, match="negative"):
        buffered.staleness_weight(-1)


def test_staleness_counts_versions_since_the_clients_base() -> None:
    assert buffered.staleness(buffer_base=5, client_base=5) == 0
    assert buffered.staleness(buffer_base=5, client_base=2) == 3
    assert not buffered.too_stale(3, 3)
    assert buffered.too_stale(4, 3)


def test_rebase_moves_the_current_version_by_the_weighted_change() -> None:
    current = {"p": np.array([1.0, 1.0], dtype=np.float32)}
    base = {"p": np.array([0.0, 2.0], dtype=np.float32)}
    update = {"p": np.array([2.0, 0.0], dtype=np.float32)}
    # τ = 3: s = 0.5; change (2, -2) → current + (1, -1)
    np.testing.assert_array_equal(buffered.rebase(current, base, update, 3)["p"], [2.0, 0.0])
    # τ = 0 and base = current: the update itself
    np.testing.assert_array_equal(buffered.rebase(current, current, update, 0)["p"], [2.0, 0.0])


def test_the_server_learning_rate_moves_part_of_the_way_in_the_prompts_dtype() -> None:
    current = {"p": np.array([0.0, 4.0], dtype=np.float32)}
    aggregate = {"p": np.array([2.0, 0.0], dtype=np.float64)}
    half = buffered.server_move(current, aggregate, 0.5)["p"]
    np.testing.assert_array_equal(half, [1.0, 2.0])
    assert half.dtype == np.float32
    np.testing.assert_array_equal(buffered.server_move(current, aggregate, 1.0)["p"], [2.0, 0.0])
    np.testing.assert_array_equal(buffered.server_move(current, aggregate, 2.0)["p"], [4.0, -4.0])


def test_staleness_histogram_in_ascending_order() -> None:
    assert buffered.staleness_histogram([2, 0, 0, 5]) == {"0": 2, "2": 1, "5": 1}
    assert list(buffered.staleness_histogram([3, 1])) == ["1", "3"]
    assert buffered.staleness_histogram([]) == {}
