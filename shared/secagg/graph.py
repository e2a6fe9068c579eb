"""The SecAgg+ neighbourhood graph: each client exchanges keys, shares and masks with k others instead
of all n − 1 (Bell et al., CCS 2020).

The round's participants are placed on a ring in a random order drawn from a seed, and each is joined
to the k/2 nearest on either side (a Harary graph). k is even whenever k < n − 1, so every client has
degree exactly k for every n (an odd k is rounded up: a k-regular graph on an odd number of vertices
needs k even); k ≥ n − 1 is the complete graph (degree n − 1).

The order is a Fisher–Yates shuffle driven by SHA-256 in counter mode (``permutation``), so a client
and the coordinator draw the same graph from the same seed on any platform and library version. The
seed is the hash of the round's roster of signed public keys (``shared/secagg/signing.py``): the
coordinator learns it only once every key is in, and every client recomputes it.

k (``neighbourhood_size``) is the smallest even k for which, by a union bound over the n clients,

    n · P[Hyp(n − 1, ⌈γ·n⌉, k) ≥ t]  +  n · P[Hyp(n − 1, ⌈δ·n⌉, k) > k − t]  ≤  σ,   t = max(2, ⌊τ·k⌋ + 1),

where Hyp(N, K, k) is the number of marked clients among k drawn without replacement from N of which
K are marked. In a ring of uniformly random order, one client's k neighbours are a uniformly random
k-subset of the other n − 1 clients, so the first term bounds the chance that some client has t or
more neighbours among ⌈γ·n⌉ corrupted clients chosen before the seed is known (they could then
reconstruct its secrets), and the second the chance that some client keeps fewer than t surviving
neighbours when ⌈δ·n⌉ clients drop (its secrets could not be reconstructed: the round fails and is
retried). γ = CORRUPTED_FRACTION, δ = DROPOUT_FRACTION, σ = FAILURE_PROBABILITY; both probabilities
are computed exactly in integers. When no k < n − 1 meets the bound the graph is complete.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections import deque
from collections.abc import Sequence

CORRUPTED_FRACTION = 0.2  # γ: clients colluding with the coordinator, chosen before the seed
DROPOUT_FRACTION = 0.1  # δ: clients that drop during a round
FAILURE_PROBABILITY_LOG2 = -20  # σ = 2^−20, for both events together


def _tail(population: int, marked: int, k: int, at_least: int) -> int:
    """The number of k-subsets of `population` holding at least `at_least` of the `marked`."""
    return sum(
        math.comb(marked, x) * math.comb(population - marked, k - x)
        for x in range(max(at_least, 0), min(k, marked) + 1)
    )


def failure_bound_holds(n: int, k: int, fraction: float) -> bool:
    """Whether k meets the bound of the module's docstring for n clients and threshold fraction τ."""
    t = threshold(k, fraction)
    population = n - 1
    corrupted = math.ceil(CORRUPTED_FRACTION * n)
    dropped = math.ceil(DROPOUT_FRACTION * n)
    bad = _tail(population, corrupted, k, t) + _tail(population, dropped, k, k - t + 1)
    # n · bad / C(n − 1, k) ≤ 2^log2σ, in integers
    return n * bad * (1 << -FAILURE_PROBABILITY_LOG2) <= math.comb(population, k)


def threshold(k: int, fraction: float) -> int:
    """t: the shares of a client's secrets that reconstruct them, ⌊τ·k⌋ + 1, at least 2 (one share
    of a threshold-1 scheme is the secret itself) and at most k."""
    return max(min(2, k), min(k, math.floor(fraction * k) + 1))


def regular_degree(n: int, k: int) -> int:
    """The degree the graph gives for a requested k: k rounded up to even, or n − 1 (complete)."""
    if n < 1:
        raise ValueError(f"a round has at least one participant; got {n}")
    k = k + (k % 2)
    return n - 1 if k >= n - 1 else k


@functools.lru_cache(maxsize=256)
def neighbourhood_size(n: int, fraction: float = 0.5) -> int:
    """k for n clients and threshold fraction τ: the smallest even k meeting the bound of the module's
    docstring, or n − 1 (the complete graph) when none below n − 1 does."""
    if n < 1:
        raise ValueError(f"a round has at least one participant; got {n}")
    for k in range(2, n - 1, 2):
        if failure_bound_holds(n, k, fraction):
            return k
    return n - 1


def permutation(n: int, seed: bytes) -> list[int]:
    """A permutation of 1..n drawn from `seed` (Fisher–Yates over SHA-256 in counter mode)."""
    order = list(range(1, n + 1))
    counter = 0
    for i in range(n - 1, 0, -1):
        bound = i + 1
        limit = (1 << 64) - (1 << 64) % bound  # rejection sampling: no modulo bias
        while True:
            value = int.from_bytes(hashlib.sha256(seed + counter.to_bytes(8, "big")).digest()[:8], "big")
            counter += 1
            if value < limit:
                break
        j = value % bound
        order[i], order[j] = order[j], order[i]
    return order


def neighbours(n: int, seed: bytes, k: int) -> dict[int, list[int]]:
    """Each participant's neighbours (indices 1..n), symmetric, of degree regular_degree(n, k)."""
    if k < 0:
        raise ValueError(f"a neighbourhood size is not negative; got {k}")
    k = regular_degree(n, k)
    if k >= n - 1:
        return {i: [j for j in range(1, n + 1) if j != i] for i in range(1, n + 1)}
    order = permutation(n, seed)
    half = k // 2
    out: dict[int, set[int]] = {i: set() for i in range(1, n + 1)}
    for p, client in enumerate(order):
        for d in range(1, half + 1):
            out[client].update((order[(p + d) % n], order[(p - d) % n]))
    return {i: sorted(peers) for i, peers in out.items()}


def relabel(graph: dict[int, list[int]], members: Sequence[int]) -> dict[int, list[int]]:
    """A graph over 1..m moved onto `members` (sorted): vertex p becomes the p-th member."""
    ordered = sorted(members)
    return {ordered[i - 1]: [ordered[j - 1] for j in peers] for i, peers in graph.items()}


def is_connected(graph: dict[int, list[int]]) -> bool:
    """Whether every participant reaches every other through neighbours."""
    if not graph:
        return True
    start = next(iter(graph))
    seen, todo = {start}, deque([start])
    while todo:
        for peer in graph[todo.popleft()]:
            if peer not in seen:
                seen.add(peer)
                todo.append(peer)
    return len(seen) == len(graph)
