"""The SecAgg+ neighbourhood graph: each client exchanges keys, shares and masks with k = O(log n)
others instead of all n − 1 (Bell et al., CCS 2020).

The round's participants, numbered 1..n, are placed on a ring in a seeded random order, and each is
joined to the k/2 nearest on either side (a Harary graph): every client has degree k, the graph is
connected, and which clients are neighbours depends on the seed, not on the client ids. With
k = 2·⌈log2 n⌉ (``neighbourhood_size``), 1,000 clients talk to 20 others each.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np


def neighbourhood_size(n: int) -> int:
    """k: 2·⌈log2 n⌉, at most n − 1 (a complete graph for small rounds)."""
    if n < 1:
        raise ValueError(f"a round has at least one participant; got {n}")
    if n == 1:
        return 0
    return min(n - 1, 2 * math.ceil(math.log2(n)))


def neighbours(n: int, seed: int | list[int], k: int | None = None) -> dict[int, list[int]]:
    """Each participant's neighbours (indices 1..n), symmetric, degree k (default neighbourhood_size)."""
    k = neighbourhood_size(n) if k is None else k
    if not 0 <= k <= n - 1:
        raise ValueError(f"a neighbourhood of {k} needs at least {k + 1} participants; got {n}")
    if k >= n - 1:
        return {i: [j for j in range(1, n + 1) if j != i] for i in range(1, n + 1)}
    order = [int(i) + 1 for i in np.random.default_rng(seed).permutation(n)]
    position = {client: p for p, client in enumerate(order)}
    half = k // 2
    out: dict[int, set[int]] = {i: set() for i in range(1, n + 1)}
    for client, p in position.items():
        for d in range(1, half + 1):
            out[client].update((order[(p + d) % n], order[(p - d) % n]))
        if k % 2 and n % 2 == 0:  # odd k: also the opposite client on the ring (n even)
            out[client].add(order[(p + n // 2) % n])
    return {i: sorted(peers) for i, peers in out.items()}


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
