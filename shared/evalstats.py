"""Per-class evaluation figures: how a worker's evaluation report carries its confusion matrix, how the
coordinator sums the matrices of several clients, and the per-class accuracy and macro-F1 read off one.

An evaluation report's `metrics` is a flat map of numbers, so the matrix travels as one count per cell:
`confusion_<true>_<predicted>` (labels by id). Counts are summed across clients (never averaged); a
report without them (an older worker) leaves the per-class figures out of the summary.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

# Enough for any classification data set the worker takes; a report with more labels carries no matrix.
MAX_LABELS = 16
_CELL = re.compile(r"confusion_(\d{1,2})_(\d{1,2})")


def confusion_metrics(confusion: list[list[int]]) -> dict[str, int]:
    """The report's `metrics` entries of a confusion matrix (confusion[true][predicted])."""
    if not confusion or len(confusion) > MAX_LABELS:
        return {}
    return {
        f"confusion_{t}_{p}": int(count) for t, row in enumerate(confusion) for p, count in enumerate(row)
    }


def is_class_count(key: str) -> bool:
    """True for a confusion-matrix cell of a report's metrics (summed, not averaged)."""
    return _CELL.fullmatch(key) is not None


def read_confusion(metrics: Mapping[str, Any] | None) -> list[list[int]] | None:
    """The confusion matrix a report's metrics carry (None when there is none, or it is not k x k)."""
    cells: dict[tuple[int, int], int] = {}
    for key, value in (metrics or {}).items():
        match = _CELL.fullmatch(key)
        if match is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or value != int(value):
            return None
        cells[(int(match[1]), int(match[2]))] = int(value)
    if not cells:
        return None
    k = max(max(t, p) for t, p in cells) + 1
    if len(cells) != k * k or k > MAX_LABELS:
        return None
    return [[cells[(t, p)] for p in range(k)] for t in range(k)]


def sum_confusions(matrices: Iterable[list[list[int]] | None]) -> list[list[int]] | None:
    """The cell-wise sum of several clients' matrices; None when any is missing or the sizes differ."""
    total: list[list[int]] | None = None
    for matrix in matrices:
        if matrix is None:
            return None
        if total is None:
            total = [list(row) for row in matrix]
            continue
        if len(matrix) != len(total):
            return None
        total = [[a + b for a, b in zip(ra, rb, strict=True)] for ra, rb in zip(total, matrix, strict=True)]
    return total


def per_class_accuracy(confusion: list[list[int]]) -> list[float | None]:
    """Recall of each label: correct / examples of the label (None for a label with no examples)."""
    return [row[i] / sum(row) if sum(row) else None for i, row in enumerate(confusion)]


def macro_f1(confusion: list[list[int]]) -> float | None:
    """The unweighted mean of every label's F1 (a label never present nor predicted counts 0)."""
    k = len(confusion)
    if k == 0:
        return None
    scores = []
    for c in range(k):
        predicted = sum(confusion[t][c] for t in range(k))
        actual = sum(confusion[c])
        scores.append(2 * confusion[c][c] / (predicted + actual) if predicted + actual else 0.0)
    return sum(scores) / k


def class_summary(confusion: list[list[int]] | None) -> dict[str, Any]:
    """What a summary shows of a summed matrix: the matrix, per-class accuracy and examples, macro-F1."""
    if confusion is None:
        return {}
    return {
        "confusion": confusion,
        "per_class_accuracy": per_class_accuracy(confusion),
        "per_class_samples": [sum(row) for row in confusion],
        "macro_f1": macro_f1(confusion),
    }
