"""Splitting a data set among K clients: IID, quantity skew and label skew (pure functions, no I/O).

Each client's index list comes in shuffled order (iid(n, 1, seed)[0] is a seeded permutation of 0..n-1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

Kind = Literal["iid", "quantity", "label"]


class PartitionError(ValueError):
    """A partition scheme or its arguments that cannot be used."""


@dataclass(frozen=True)
class Scheme:
    """A parsed partition scheme: 'iid', or a Dirichlet skew with concentration alpha."""

    kind: Kind
    alpha: float | None = None

    def __str__(self) -> str:
        return self.kind if self.alpha is None else f"{self.kind}:{self.alpha:g}"


def _check(n: int, k: int) -> None:
    if k < 1:
        raise PartitionError(f"number of clients must be >= 1; got {k}")
    if n < k:
        raise PartitionError(f"cannot split {n} examples among {k} clients: every client needs at least one")


def _check_alpha(alpha: float) -> None:
    if not (alpha > 0 and math.isfinite(alpha)):
        raise PartitionError(f"Dirichlet alpha must be a positive finite number; got {alpha}")


def _rng(seed: int, salt: int) -> np.random.Generator:
    return np.random.default_rng([seed, salt])


def _default_min(n: int, k: int) -> int:
    """At least a few examples per client: 10, or less when there are not that many per client."""
    return max(1, min(10, n // (2 * k)))


def iid(n: int, k: int, seed: int = 0) -> list[list[int]]:
    """Shuffle 0..n-1 and cut it into k parts of equal size (±1), as in the paper; each part in shuffled order."""
    _check(n, k)
    order = _rng(seed, 1).permutation(n)
    return [[int(i) for i in part] for part in np.array_split(order, k)]


def quantity_dirichlet(
    n: int, k: int, alpha: float, seed: int = 0, min_size: int | None = None
) -> list[list[int]]:
    """Client sizes ~ n·Dir(alpha) (smaller alpha, more unequal), each client at least min_size examples."""
    _check(n, k)
    _check_alpha(alpha)
    floor = _default_min(n, k) if min_size is None else min_size
    if floor * k > n:
        raise PartitionError(f"min_size={floor} for {k} clients needs {floor * k} examples; there are {n}")
    rng = _rng(seed, 2)
    shares = rng.dirichlet(np.full(k, alpha))
    sizes = floor + rng.multinomial(n - floor * k, shares)
    order = rng.permutation(n)
    bounds = np.cumsum(sizes)[:-1]
    return [[int(i) for i in part] for part in np.split(order, bounds)]


def label_dirichlet(
    labels: Sequence[int], k: int, alpha: float, seed: int = 0, min_size: int | None = None
) -> list[list[int]]:
    """Per label, split its examples among clients by proportions ~ Dir(alpha) (Hsu et al. 2019 label skew)."""
    n = len(labels)
    _check(n, k)
    _check_alpha(alpha)
    floor = _default_min(n, k) if min_size is None else min_size
    if floor * k > n:
        raise PartitionError(f"min_size={floor} for {k} clients needs {floor * k} examples; there are {n}")
    y = np.asarray(labels)
    rng = _rng(seed, 3)
    classes = np.unique(y)
    parts: list[list[int]] = [[] for _ in range(k)]
    # Redraw a few times, as the usual recipe does, when some client ends up (almost) empty.
    for _attempt in range(20):
        parts = [[] for _ in range(k)]
        for c in classes:
            members = rng.permutation(np.flatnonzero(y == c))
            shares = rng.dirichlet(np.full(k, alpha))
            cuts = (np.cumsum(shares)[:-1] * len(members)).astype(int)
            for client, chunk in enumerate(np.split(members, cuts)):
                parts[client].extend(int(i) for i in chunk)
        if min(len(p) for p in parts) >= floor:
            break
    else:
        # Still short: move random examples from the largest clients, which keeps the skew of the rest.
        for client in range(k):
            while len(parts[client]) < floor:
                donor = max(range(k), key=lambda j: len(parts[j]))
                take = int(rng.integers(len(parts[donor])))
                parts[client].append(parts[donor].pop(take))
    # Shuffled like the other schemes, so that a prefix of a client's list is a random sample of it.
    return [[int(i) for i in rng.permutation(p)] for p in parts]


def parse_partition(text: str) -> Scheme:
    """Parse 'iid', 'quantity:ALPHA' or 'label:ALPHA' (e.g. 'label:0.3')."""
    usage = "expected 'iid', 'quantity:ALPHA' or 'label:ALPHA' with ALPHA > 0 (e.g. 'label:0.3')"
    raw = text.strip().lower()
    if raw == "iid":
        return Scheme("iid")
    kind, sep, value = raw.partition(":")
    match kind:
        case "quantity" | "label" if sep:
            skew = kind
        case _:
            raise PartitionError(f"unknown partition scheme {text!r}; {usage}")
    try:
        alpha = float(value)
    except ValueError:
        raise PartitionError(f"partition scheme {text!r} has no numeric alpha; {usage}") from None
    if not (alpha > 0 and math.isfinite(alpha)):
        raise PartitionError(f"partition scheme {text!r}: alpha must be positive and finite; {usage}")
    return Scheme(skew, alpha)


def partition(labels: Sequence[int], scheme: str | Scheme, k: int, seed: int = 0) -> list[list[int]]:
    """Split example indices 0..len(labels)-1 among k clients with the given scheme."""
    parsed = parse_partition(scheme) if isinstance(scheme, str) else scheme
    if parsed.kind == "iid":
        return iid(len(labels), k, seed)
    assert parsed.alpha is not None
    if parsed.kind == "quantity":
        return quantity_dirichlet(len(labels), k, parsed.alpha, seed)
    return label_dirichlet(labels, k, parsed.alpha, seed)
