"""Client partitions: every index exactly once, seeded, and skews that actually skew."""

from __future__ import annotations

import numpy as np
import pytest
from fedprompt.worker.data import (
    PartitionError,
    Scheme,
    iid,
    label_dirichlet,
    parse_partition,
    partition,
    quantity_dirichlet,
)

LABELS = [0] * 300 + [1] * 300 + [2] * 200  # 800 examples, 3 classes


def assert_exact_cover(parts: list[list[int]], n: int) -> None:
    """Every index 0..n-1 appears in exactly one client."""
    flat = [i for part in parts for i in part]
    assert sorted(flat) == list(range(n))
    assert all(isinstance(i, int) for i in flat)


def test_iid_equal_parts_cover_everything() -> None:
    parts = iid(10, 3, seed=0)

    assert_exact_cover(parts, 10)
    assert sorted(len(p) for p in parts) == [3, 3, 4]


def test_iid_is_seeded() -> None:
    assert iid(100, 4, seed=1) == iid(100, 4, seed=1)
    assert iid(100, 4, seed=1) != iid(100, 4, seed=2)


def test_iid_is_shuffled_not_contiguous() -> None:
    parts = iid(100, 4, seed=0)

    assert sorted(parts[0]) != list(range(25))
    assert parts[0] != sorted(parts[0])


def test_one_client_gets_a_seeded_permutation() -> None:
    (only,) = iid(20, 1, seed=3)

    assert sorted(only) == list(range(20))
    assert only != list(range(20))
    assert only == iid(20, 1, seed=3)[0]


@pytest.mark.parametrize("scheme", ["quantity:1", "label:1"])
def test_skewed_client_lists_are_shuffled(scheme: str) -> None:
    parts = partition(LABELS, scheme, 2, seed=0)

    assert all(p != sorted(p) for p in parts)


def test_quantity_skew_with_small_alpha_is_unequal() -> None:
    parts = quantity_dirichlet(1000, 10, alpha=0.1, seed=0)
    sizes = sorted(len(p) for p in parts)

    assert_exact_cover(parts, 1000)
    assert sizes[-1] > 5 * sizes[0]
    assert sizes[0] >= 10


def test_quantity_skew_with_large_alpha_is_nearly_equal() -> None:
    sizes = [len(p) for p in quantity_dirichlet(1000, 10, alpha=1000.0, seed=0)]

    assert max(sizes) - min(sizes) < 30


def test_quantity_skew_is_seeded_and_respects_min_size() -> None:
    a = quantity_dirichlet(200, 5, alpha=0.05, seed=3)

    assert a == quantity_dirichlet(200, 5, alpha=0.05, seed=3)
    assert a != quantity_dirichlet(200, 5, alpha=0.05, seed=4)
    assert min(len(p) for p in a) >= 10
    assert min(len(p) for p in quantity_dirichlet(200, 5, alpha=0.05, seed=3, min_size=30)) >= 30


def label_shares(parts: list[list[int]], labels: list[int]) -> np.ndarray:
    """Fraction of each client's examples per label (rows: clients)."""
    y = np.asarray(labels)
    counts = np.array([[np.sum(y[p] == c) for c in range(3)] for p in parts], dtype=float)
    return counts / counts.sum(axis=1, keepdims=True)


def test_label_skew_with_small_alpha_concentrates_labels() -> None:
    parts = label_dirichlet(LABELS, 4, alpha=0.1, seed=0)
    skewed = label_shares(parts, LABELS).max(axis=1)
    balanced = label_shares(iid(len(LABELS), 4, seed=0), LABELS).max(axis=1)

    assert_exact_cover(parts, len(LABELS))
    assert skewed.mean() > 0.75
    assert balanced.max() < 0.5


def test_label_skew_with_large_alpha_is_close_to_iid() -> None:
    parts = label_dirichlet(LABELS, 4, alpha=1000.0, seed=0)

    shares = label_shares(parts, LABELS)
    assert np.abs(shares - np.array([300, 300, 200]) / 800).max() < 0.05


def test_label_skew_is_seeded_and_gives_every_client_some_examples() -> None:
    a = label_dirichlet(LABELS, 8, alpha=0.05, seed=5)

    assert a == label_dirichlet(LABELS, 8, alpha=0.05, seed=5)
    assert a != label_dirichlet(LABELS, 8, alpha=0.05, seed=6)
    assert min(len(p) for p in a) >= 10
    assert_exact_cover(a, len(LABELS))


def test_label_skew_on_a_tiny_literal_input() -> None:
    labels = [0, 0, 0, 1, 1, 1]

    parts = label_dirichlet(labels, 2, alpha=0.5, seed=0, min_size=1)

    assert_exact_cover(parts, 6)
    assert all(len(p) >= 1 for p in parts)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("iid", Scheme("iid")),
        (" IID ", Scheme("iid")),
        ("quantity:0.5", Scheme("quantity", 0.5)),
        ("label:0.3", Scheme("label", 0.3)),
        ("label:10", Scheme("label", 10.0)),
    ],
)
def test_parse_partition(text: str, expected: Scheme) -> None:
    assert parse_partition(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("dirichlet:0.5", "unknown partition scheme 'dirichlet:0.5'"),
        ("label", "unknown partition scheme 'label'"),
        ("label:abc", "no numeric alpha"),
        ("quantity:0", "alpha must be positive"),
        ("quantity:-1", "alpha must be positive"),
        ("label:nan", "alpha must be positive"),
        ("label:inf", "alpha must be positive"),
        ("", "unknown partition scheme"),
    ],
)
def test_parse_partition_errors(text: str, message: str) -> None:
    with pytest.raises(PartitionError, match=message):
        parse_partition(text)


def test_partition_dispatches() -> None:
    assert partition(LABELS, "iid", 4, seed=1) == iid(len(LABELS), 4, seed=1)
    assert partition(LABELS, "quantity:0.5", 4, seed=1) == quantity_dirichlet(len(LABELS), 4, 0.5, seed=1)
    assert partition(LABELS, Scheme("label", 0.3), 4, seed=1) == label_dirichlet(LABELS, 4, 0.3, seed=1)


@pytest.mark.parametrize("scheme", ["iid", "quantity:1", "label:1"])
def test_more_clients_than_examples_is_refused(scheme: str) -> None:
    with pytest.raises(PartitionError, match="cannot split 3 examples among 4 clients"):
        partition([0, 1, 0], scheme, 4)


def test_zero_clients_is_refused() -> None:
    with pytest.raises(PartitionError, match=">= 1"):
        iid(10, 0)


def test_min_size_that_cannot_be_met_is_refused() -> None:
    with pytest.raises(PartitionError, match="min_size=30"):
        quantity_dirichlet(100, 4, 1.0, min_size=30)
