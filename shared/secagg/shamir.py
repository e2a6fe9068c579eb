"""Shamir's secret sharing over the prime field GF(p), p = 2^521 − 1 (a Mersenne prime).

A secret of up to 64 bytes is the constant term of a random polynomial of degree t − 1; share x is
the polynomial at x (x = 1, 2, …, distinct and non-zero). Any t shares give the secret back by
Lagrange interpolation at 0; fewer are refused (and reveal nothing about it).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Sequence

PRIME = 2**521 - 1
SHARE_BYTES = 66  # ceil(521 / 8)
MAX_SECRET_BYTES = 64

RandBelow = Callable[[int], int]


class ShamirError(ValueError):
    """Shares that cannot give a secret: too few, repeated or out of range."""


def split(
    secret: bytes, threshold: int, xs: Sequence[int], *, randbelow: RandBelow = secrets.randbelow
) -> dict[int, int]:
    """Shares of `secret` at the points `xs`, any `threshold` of which reconstruct it.

    `randbelow(n)` draws the polynomial's coefficients (default: the OS CSPRNG; a test passes a
    seeded one, e.g. random.Random(seed).randrange)."""
    if len(secret) > MAX_SECRET_BYTES:
        raise ShamirError(f"a secret holds at most {MAX_SECRET_BYTES} bytes; got {len(secret)}")
    _check_points(xs)
    if not 1 <= threshold <= len(xs):
        raise ShamirError(f"threshold must be in [1, {len(xs)}] (the number of shares); got {threshold}")
    coefficients = [int.from_bytes(secret, "big")] + [randbelow(PRIME) for _ in range(threshold - 1)]
    return {x: _evaluate(coefficients, x) for x in xs}


def reconstruct(shares: dict[int, int], threshold: int, length: int = 32) -> bytes:
    """The secret (`length` bytes) from at least `threshold` shares {x: y}; fewer are refused."""
    if len(shares) < threshold:
        raise ShamirError(f"{len(shares)} share(s) cannot reconstruct a secret of threshold {threshold}")
    points = sorted(shares.items())[:threshold]
    _check_points([x for x, _ in points])
    if any(not 0 <= y < PRIME for _, y in points):
        raise ShamirError("a share lies outside the field")
    secret = 0
    for i, (xi, yi) in enumerate(points):
        num, den = 1, 1
        for j, (xj, _) in enumerate(points):
            if i != j:
                num = num * (-xj) % PRIME
                den = den * (xi - xj) % PRIME
        secret = (secret + yi * num * pow(den, -1, PRIME)) % PRIME
    if secret >= 256**length:
        raise ShamirError("the shares do not belong to one secret of this length")
    return secret.to_bytes(length, "big")


def share_to_bytes(y: int) -> bytes:
    """A share's value as SHARE_BYTES big-endian bytes."""
    return y.to_bytes(SHARE_BYTES, "big")


def share_from_bytes(data: bytes) -> int:
    """The inverse of share_to_bytes, checked to lie in the field."""
    if len(data) != SHARE_BYTES:
        raise ShamirError(f"a share is {SHARE_BYTES} bytes; got {len(data)}")
    y = int.from_bytes(data, "big")
    if y >= PRIME:
        raise ShamirError("a share lies outside the field")
    return y


def _evaluate(coefficients: Sequence[int], x: int) -> int:
    y = 0
    for c in reversed(coefficients):
        y = (y * x + c) % PRIME
    return y


def _check_points(xs: Iterable[int]) -> None:
    seen: set[int] = set()
    for x in xs:
        if not 0 < x < PRIME:
            raise ShamirError(f"share points must be in [1, p); got {x}")
        if x in seen:
            raise ShamirError(f"share point {x} is repeated")
        seen.add(x)
