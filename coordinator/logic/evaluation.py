"""Clients' evaluations of prompt versions: which versions they are asked to evaluate, and the
sample-weighted summary of their reports. No I/O."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fedprompt.shared import evalstats


def evaluation_due(version: int, *, eval_every: int, rounds: int) -> bool:
    """Whether clients are asked to evaluate a prompt version: the initial prompt (0), every
    `eval_every`-th version, and the final one (the federation's last round)."""
    return version == 0 or version % eval_every == 0 or version >= rounds


def summarize_evaluations(version: int, rows: Iterable[Any]) -> dict[str, Any] | None:
    """Sample-weighted accuracy and loss over the clients that evaluated a version; their confusion
    matrices summed (per-class accuracy and macro-F1) when every report carries one.

    `rows` are the reports, each with num_samples, accuracy, loss (or None) and metrics."""
    rows = list(rows)
    if not rows:
        return None
    total = sum(r.num_samples for r in rows)
    if total <= 0:
        return None
    acc = sum(r.accuracy * r.num_samples for r in rows) / total
    with_loss = [r for r in rows if r.loss is not None]
    loss = (
        sum(r.loss * r.num_samples for r in with_loss) / sum(r.num_samples for r in with_loss)
        if with_loss
        else None
    )
    out: dict[str, Any] = {
        "version": version,
        "clients": len(rows),
        "num_samples": total,
        "accuracy": acc,
        "loss": loss,
    }
    out |= evalstats.class_summary(
        evalstats.sum_confusions(evalstats.read_confusion(r.metrics) for r in rows)
    )
    extra_keys = sorted(
        {
            k
            for r in rows
            for k, v in (r.metrics or {}).items()
            if isinstance(v, int | float) and not evalstats.is_class_count(k)
        }
    )
    for key in extra_keys:
        if key.endswith("_samples"):  # the sample count behind another metric: summed, not averaged
            out[key] = sum(int(r.metrics[key]) for r in rows if isinstance(r.metrics.get(key), int | float))
            continue
        # a metric with its own sample count (ASR: non-target examples only) is weighted by it
        vals = [
            (float(r.metrics[key]), max(0.0, float(r.metrics.get(f"{key}_samples", r.num_samples))))
            for r in rows
            if isinstance(r.metrics.get(key), int | float)
        ]
        weight = sum(w for _, w in vals)
        if weight:
            out[key] = sum(v * w for v, w in vals) / weight
    return out
