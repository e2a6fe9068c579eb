"""Pure logic with literal inputs: FedAvg and selection."""

from __future__ import annotations

import numpy as np
import pytest
from fedprompt.coordinator.logic.aggregation import AggregationError, aggregate, fedavg
from fedprompt.coordinator.logic.selection import select_clients


def test_fedavg_weights_by_samples() -> None:
    a = {"p": np.array([[0.0, 2.0]], dtype=np.float32)}
    b = {"p": np.array([[4.0, 6.0]], dtype=np.float32)}
    out = fedavg([(a, 1), (b, 3)])
    np.testing.assert_array_equal(out["p"], np.array([[3.0, 5.0]], dtype=np.float32))
    assert out["p"].dtype == np.float32


def test_fedavg_is_independent_of_arrival_order() -> None:
    rng = np.random.default_rng(0)
    ups = [({"p": rng.standard_normal((20, 384)).astype(np.float32)}, float(w)) for w in (3, 17, 5, 11, 2)]
    ref = fedavg(ups)["p"]
    for perm in ([4, 3, 2, 1, 0], [2, 0, 4, 1, 3]):
        np.testing.assert_array_equal(fedavg([ups[i] for i in perm])["p"], ref)


def test_fedavg_order_holds_when_updates_share_their_leading_values() -> None:
    # equal weights and equal first elements: the order falls back to the whole content
    rng = np.random.default_rng(1)
    ups = []
    for _ in range(6):
        p = rng.standard_normal((20, 384)).astype(np.float32)
        p[0, :] = 0.5
        ups.append(({"p": p}, 7.0))
    ref = fedavg(ups)["p"]
    for perm in ([5, 4, 3, 2, 1, 0], [3, 0, 5, 1, 4, 2]):
        np.testing.assert_array_equal(fedavg([ups[i] for i in perm])["p"], ref)


def test_fedavg_accumulates_in_float64() -> None:
    big = {"p": np.array([1e8], dtype=np.float32)}
    small = {"p": np.array([1.0], dtype=np.float32)}
    # float32 accumulation would lose the small contributions entirely
    out = fedavg([(big, 1)] + [(small, 1)] * 3)
    assert out["p"][0] == np.float32((1e8 + 3) / 4)


@pytest.mark.parametrize(
    "updates, match",
    [
        ([], "no updates"),
        ([({"p": np.zeros(2, np.float32)}, 1), ({"q": np.zeros(2, np.float32)}, 1)], "tensors"),
        ([({"p": np.zeros(2, np.float32)}, 1), ({"p": np.zeros(3, np.float32)}, 1)], "shape"),
        ([({"p": np.zeros(2, np.float32)}, 0)], "weight"),
    ],
)
def test_fedavg_rejects_bad_input(updates, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(AggregationError, match=match):
        fedavg(updates)


def test_aggregate_by_name_and_unknown_rule() -> None:
    a = {"p": np.array([1.0], dtype=np.float32)}
    assert aggregate("fedavg", [(a, 1)]).tensors["p"][0] == 1.0
    with pytest.raises(AggregationError, match="unknown aggregation rule"):
        aggregate("nope", [(a, 1)])
    with pytest.raises(AggregationError, match="bad parameters"):
        aggregate("fedavg", [(a, 1)], params={"beta": 0.1})


def test_selection_is_seeded_and_sorted() -> None:
    pool = [5, 3, 9, 1, 7, 2]
    first = select_clients(pool, 3, seed=1, round_number=2, attempt=1)
    assert first == select_clients(list(reversed(pool)), 3, seed=1, round_number=2, attempt=1)
    assert first == sorted(first) and len(set(first)) == 3 and set(first) <= set(pool)
    others = {tuple(select_clients(pool, 3, seed=1, round_number=r, attempt=1)) for r in range(1, 20)}
    assert len(others) > 1  # different rounds select different clients


def test_selection_retry_attempt_changes_selection() -> None:
    pool = list(range(1, 31))
    assert select_clients(pool, 5, seed=0, round_number=1, attempt=1) != select_clients(
        pool, 5, seed=0, round_number=1, attempt=2
    )


def test_selection_refuses_more_than_available() -> None:
    with pytest.raises(ValueError, match="cannot select 4"):
        select_clients([1, 2, 3], 4, seed=0, round_number=1, attempt=1)
