"""Aggregation rules: pure functions over [(tensors, weight), ...]. No I/O.

Each rule takes the round's updates as a list of (named tensors, num_samples) and returns the new
named tensors. Accumulation is in float64 and the result is cast back to the inputs' dtype; sums
run in a canonical order so the result does not depend on arrival order.
"""

from __future__ import annotations

import inspect
import itertools
import math
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Tensors = Mapping[str, np.ndarray]
_HEAD = 16  # leading elements of an update that key its place in the canonical order
STREAM_BLOCK = 128  # updates per block of the streaming FedAvg (128 x 20 x 384 float64 = 7.5 MiB)
Weighted = Sequence[tuple[Tensors, float]]


class AggregationError(ValueError):
    """The updates cannot be aggregated (none, mismatched names/shapes, bad weights or params)."""


@dataclass(frozen=True)
class AggregationResult:
    """New tensors plus what the rule did with each update (index → note), for the round history."""

    tensors: dict[str, np.ndarray]
    notes: dict[int, str] = field(default_factory=dict)


def _check(updates: Weighted) -> list[str]:
    if not updates:
        raise AggregationError("no updates to aggregate")
    names = sorted(updates[0][0])
    for i, (tensors, weight) in enumerate(updates):
        if sorted(tensors) != names:
            raise AggregationError(f"update {i} has tensors {sorted(tensors)}, expected {names}")
        for name in names:
            if tensors[name].shape != updates[0][0][name].shape:
                raise AggregationError(f"update {i}: tensor '{name}' has shape {tensors[name].shape}")
        if not np.isfinite(weight) or weight <= 0:
            raise AggregationError(f"update {i} has weight {weight}; weights must be positive")
    return names


def _canonical_order(updates: Weighted, names: list[str]) -> list[int]:
    """Order updates by their content so floating-point sums are independent of arrival order.

    The key is the weight and the first bytes of the first tensor, which almost always differ between
    updates; only updates that tie on it are told apart by checksums of their whole content, so the
    order costs a few bytes per update instead of a pass over every byte (updates equal in full may
    go in any order: they add the same numbers).
    """

    heads = [(float(w), np.asarray(t[names[0]]).flat[:_HEAD].tobytes()) for t, w in updates]

    def checksum(i: int) -> tuple[int, int]:
        # two fast checksums of the content (64 bits): neither copies an update nor costs a
        # cryptographic hash; equal checksums for different contents are vanishingly rare
        crc, adler = 0, 1
        for n in names:
            data = np.ascontiguousarray(updates[i][0][n]).data
            crc, adler = zlib.crc32(data, crc), zlib.adler32(data, adler)
        return crc, adler

    order = sorted(range(len(updates)), key=heads.__getitem__)
    out: list[int] = []
    for _, group in itertools.groupby(order, key=heads.__getitem__):
        tied = list(group)
        out.extend(sorted(tied, key=checksum) if len(tied) > 1 else tied)
    return out


def fedavg(updates: Weighted) -> dict[str, np.ndarray]:
    """FedAvg: the mean of each tensor weighted by the clients' sample counts."""
    _check(updates)
    order = _canonical_order(updates, sorted(updates[0][0]))
    return fedavg_stream((updates[i] for i in order), float(sum(w for _, w in updates)))


def fedavg_stream(updates: Iterable[tuple[Tensors, float]], total_weight: float) -> dict[str, np.ndarray]:
    """FedAvg over updates taken one at a time (in the caller's canonical order): holds the float64 sums
    and one block of at most STREAM_BLOCK updates, never all of them."""
    if not np.isfinite(total_weight) or total_weight <= 0:
        raise AggregationError(f"total weight is {total_weight}; weights must be positive")
    acc: dict[str, np.ndarray] = {}
    block: dict[str, np.ndarray] = {}
    like: dict[str, np.ndarray] = {}
    scale = np.zeros(STREAM_BLOCK, dtype=np.float64)
    filled, seen = 0, 0.0

    def flush(n: int) -> None:  # acc += scale · block, float64; einsum, not BLAS: one thread, same sums
        for name, target in acc.items():
            target += np.einsum("i,ij->j", scale[:n], block[name][:n]).reshape(target.shape)

    for i, (tensors, weight) in enumerate(updates):
        if not like:
            like = {n: tensors[n] for n in sorted(tensors)}
            acc = {n: np.zeros(t.shape, dtype=np.float64) for n, t in like.items()}
            block = {n: np.empty((STREAM_BLOCK, t.size), dtype=np.float64) for n, t in like.items()}
        if sorted(tensors) != list(like):
            raise AggregationError(f"update {i} has tensors {sorted(tensors)}, expected {list(like)}")
        if not np.isfinite(weight) or weight <= 0:
            raise AggregationError(f"update {i} has weight {weight}; weights must be positive")
        for name, target in acc.items():
            if tensors[name].shape != target.shape:
                raise AggregationError(f"update {i}: tensor '{name}' has shape {tensors[name].shape}")
            block[name][filled] = tensors[name].reshape(-1)  # float32 -> float64 copy
        scale[filled] = float(weight) / total_weight
        filled += 1
        seen += float(weight)
        if filled == STREAM_BLOCK:
            flush(filled)
            filled = 0
    if not like:
        raise AggregationError("no updates to aggregate")
    flush(filled)
    if not math.isclose(seen, total_weight, rel_tol=1e-9):
        raise AggregationError(f"the updates' weights sum to {seen}, not the announced {total_weight}")
    return {name: target.astype(like[name].dtype) for name, target in acc.items()}


Rule = Callable[..., AggregationResult]
_RULES: dict[str, Rule] = {}


def register(name: str) -> Callable[[Rule], Rule]:
    """Register an aggregation rule under a name usable in a FederationSpec."""

    def deco(fn: Rule) -> Rule:
        _RULES[name] = fn
        return fn

    return deco


@register("fedavg")
def _fedavg_rule(updates: Weighted, *, global_tensors: Tensors | None = None) -> AggregationResult:
    del global_tensors  # FedAvg does not look at the previous global prompt
    return AggregationResult(fedavg(updates))


def available_rules() -> list[str]:
    """Names of the registered rules."""
    return sorted(_RULES)


def check_params(name: str, params: Mapping[str, Any] | None) -> None:
    """Validate a rule's name and parameters up front (a dry run on small synthetic updates)."""
    if name not in _RULES:
        raise AggregationError(f"unknown aggregation rule '{name}'; available: {available_rules()}")
    accepted = [
        p.name
        for p in inspect.signature(_RULES[name]).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name != "global_tensors"
    ]
    unknown = sorted(set(params or {}) - set(accepted))
    if unknown:
        raise AggregationError(
            f"aggregation rule '{name}' has no parameter(s) {unknown}; it takes {accepted}"
        )
    f = (params or {}).get("f", 0)
    n = max(5, 2 * int(f) + 3) if isinstance(f, int | float) else 5
    rng = np.random.default_rng(0)
    dry = [({"p": rng.standard_normal(4).astype(np.float32)}, float(i + 1)) for i in range(n)]
    aggregate(name, dry, params=params, global_tensors={"p": np.zeros(4, np.float32)})


def aggregate(
    name: str,
    updates: Weighted,
    *,
    params: Mapping[str, Any] | None = None,
    global_tensors: Tensors | None = None,
) -> AggregationResult:
    """Run the named rule with its parameters."""
    try:
        rule = _RULES[name]
    except KeyError:
        raise AggregationError(f"unknown aggregation rule '{name}'; available: {available_rules()}") from None
    try:
        return rule(updates, global_tensors=global_tensors, **dict(params or {}))
    except (TypeError, ValueError) as exc:
        raise AggregationError(f"bad parameters for aggregation rule '{name}': {exc}") from None
