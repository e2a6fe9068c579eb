"""Verdicts computed from the seeds, never written by hand (pure: lists of numbers in, words out).

The rules, stated once (docs/experiments.md quotes them):

- **Interval**: the mean of n values with Student's t interval at 95 %, mean ± t(0.975, n − 1)·s/√n
  (s the sample standard deviation). One value has no interval.
- **Learned**: a cell has learned its task when the lower end of its accuracy's interval is above
  the majority-class rate of its test examples (with one seed: its accuracy is above it), the lower
  end of its macro-F1's interval is above chance, 1/k for k classes (uniform guessing; a constant
  predictor scores less), and no seed's final version is a constant predictor (the collapse flag).
  A cell that has not learned never counts toward a verdict.
- **Verdict** of a claim "A − B > δ" (or "< δ"), A and B two cells run on the same seeds (same shards,
  same starting prompt): the per-seed paired differences d = A − B, their interval as above;
  *holds* when the whole interval is on the claim's side of δ, *does not hold* when the whole interval
  is on the other side, *inconclusive* otherwise (one seed is always inconclusive); *not learned* when
  A or B has not learned.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats

LEVEL = 0.95


@dataclass(frozen=True)
class Interval:
    """The mean of n values and its t interval (low = high = mean when n is 1)."""

    mean: float
    low: float
    high: float
    n: int


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """The mean and the sample standard deviation (n − 1); a deviation of 0 for one value."""
    n = len(values)
    if n == 0:
        raise ValueError("a mean needs at least one value")
    mean = sum(values) / n
    return mean, (math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0)


def t_interval(values: Sequence[float], level: float = LEVEL) -> Interval:
    """mean ± t(1 − (1 − level)/2, n − 1)·s/√n; ValueError for no values."""
    n = len(values)
    if n == 0:
        raise ValueError("an interval needs at least one value")
    mean, s = mean_sd(values)
    if n == 1:
        return Interval(mean, mean, mean, 1)
    half = float(stats.t.ppf(1 - (1 - level) / 2, n - 1)) * s / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n)


def learned(
    accuracy: Sequence[float],
    majority: float,
    collapsed: Sequence[float] = (),
    macro_f1: Sequence[float] = (),
    classes: int | None = None,
) -> bool:
    """Whether a cell learned its task (the module's rule): its accuracy's interval above the
    majority-class rate, its macro-F1's above 1/classes (when both are known), and no seed's final
    version collapsed to one class."""
    if not accuracy or any(c > 0 for c in collapsed):
        return False
    if macro_f1 and classes and t_interval(macro_f1).low <= 1 / classes:
        return False
    return t_interval(accuracy).low > majority


HOLDS, FAILS, INCONCLUSIVE, NOT_LEARNED = "holds", "does not hold", "inconclusive", "not learned"


def verdict(diffs: Sequence[float], op: str, threshold: float) -> str:
    """holds / does not hold / inconclusive for the claim mean(A − B) `op` threshold (op '>' or '<'),
    from the paired per-seed differences (the module's rule)."""
    if op not in (">", "<"):
        raise ValueError(f"a claim compares with > or <, not {op!r}")
    if len(diffs) < 2:
        return INCONCLUSIVE
    iv = t_interval(diffs)
    above, below = iv.low > threshold, iv.high < threshold
    if (op == ">" and above) or (op == "<" and below):
        return HOLDS
    if (op == ">" and iv.high <= threshold) or (op == "<" and iv.low >= threshold):
        return FAILS
    return INCONCLUSIVE


def paired(a: dict[int, float], b: dict[int, float]) -> list[float]:
    """A − B for every seed both have, in seed order."""
    return [a[seed] - b[seed] for seed in sorted(a.keys() & b.keys())]
