"""Clients' evaluations of prompt versions: which versions they are asked to evaluate, and the
sample-weighted summary of their reports. No I/O."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from fedprompt.coordinator.errors import NotFound, ServiceError, revoked_client
from fedprompt.shared import evalstats


def evaluation_due(version: int, *, eval_every: int, rounds: int) -> bool:
    """Whether clients are asked to evaluate a prompt version: the initial prompt (0), every
    `eval_every`-th version, and the final one (the federation's last round)."""
    return version == 0 or version % eval_every == 0 or version >= rounds


def asked_to_evaluate(info: object, evaluators: int | None, rank: int | None) -> bool:
    """Whether a client is asked to evaluate a due version. Never when it enrolled saying it holds no
    evaluation examples (`info["num_eval"]` 0); with the spec's `evaluators`, only when fewer than
    that many clients enrolled before it (`rank`, revoked ones not counted)."""
    num_eval = info.get("num_eval") if isinstance(info, dict) else None
    if isinstance(num_eval, int) and not isinstance(num_eval, bool) and num_eval <= 0:
        return False
    return evaluators is None or (rank is not None and rank < evaluators)


@dataclass(frozen=True)
class PendingReport:
    """A client's evaluation report on its way into the database (see Uploads.report_evaluation)."""

    version: int
    client_id: int
    num_samples: int
    accuracy: float
    loss: float | None
    metrics: dict[str, Any]


def check_reports(
    items: Sequence[PendingReport],
    latest: int,
    revoked: set[int],
    stored: set[tuple[int, int]],
) -> list[bool | ServiceError]:
    """Each report's answer within one batch: True (store it), False (this client already reported
    this version: a repeat is a no-op), or why it is refused: a version that does not exist yet, or a
    client revoked by the operator. `stored` holds the (version, client) pairs already reported and
    grows with the ones accepted here, so a second report of the same pair in a batch is a repeat."""
    out: list[bool | ServiceError] = []
    for item in items:
        if item.version < 0 or item.version > latest:
            out.append(NotFound(f"prompt version {item.version} does not exist; the latest is {latest}"))
        elif item.client_id in revoked:
            out.append(revoked_client(item.client_id))
        elif (item.version, item.client_id) in stored:
            out.append(False)
        else:
            stored.add((item.version, item.client_id))
            out.append(True)
    return out


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
    out["collapsed"] = collapsed(out)
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


# A version "collapsed" when its summed predictions fall to one class: at least this share of the
# evaluated examples predicted as one label, on data holding two labels or more.
COLLAPSE_SHARE = 0.99


def predicted_share(confusion: list[list[int]] | None) -> tuple[int, float] | None:
    """(the most predicted label, its share of all predictions) of a summed confusion matrix."""
    if not confusion:
        return None
    columns = [sum(row[c] for row in confusion) for c in range(len(confusion))]
    total = sum(columns)
    if total == 0:
        return None
    top = max(range(len(columns)), key=lambda c: columns[c])
    return top, columns[top] / total


def one_class(confusion: list[list[int]] | None) -> bool:
    """Whether one report's own predictions fall to one class (COLLAPSE_SHARE of them)."""
    share = predicted_share(confusion)
    return share is not None and share[1] >= COLLAPSE_SHARE


def collapsed(summary: dict[str, Any] | None) -> bool:
    """Whether a version's predictions fall to one class (a constant predictor): COLLAPSE_SHARE of
    the examples predicted as one label while the examples hold at least two labels."""
    if not summary or not summary.get("confusion"):
        return False
    share = predicted_share(summary["confusion"])
    present = sum(1 for n in summary.get("per_class_samples", []) if n > 0)
    return share is not None and present >= 2 and share[1] >= COLLAPSE_SHARE


BEST_RULE = (
    "the evaluated version with the highest macro-F1 over the clients' summed evaluations (accuracy "
    "where a report carries no confusion matrix), never a collapsed one unless every version is; "
    "a tie goes to the later version"
)


def best_version(summaries: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """The best of the versions' evaluation summaries by BEST_RULE: {version, metric, value}, or None
    when no version was evaluated."""
    items = [s for s in summaries if s]
    if not items:
        return None
    metric = "macro_f1" if all(s.get("macro_f1") is not None for s in items) else "accuracy"
    healthy = [s for s in items if not collapsed(s)] or items
    best = max(healthy, key=lambda s: (s[metric], s["version"]))
    return {"version": best["version"], "metric": metric, "value": best[metric]}


def site_results(rows: Iterable[Any], names: dict[int, str]) -> list[dict[str, Any]]:
    """Each client's own evaluation of a version (rows with client_id, num_samples, accuracy, loss
    and metrics): accuracy, loss, examples and, where its report carries a confusion matrix, its
    per-class accuracy and macro-F1. By client id."""
    out = []
    for r in sorted(rows, key=lambda r: r.client_id):
        confusion = evalstats.read_confusion(r.metrics)
        out.append(
            {
                "client_id": r.client_id,
                "name": names.get(r.client_id, str(r.client_id)),
                "num_samples": r.num_samples,
                "accuracy": r.accuracy,
                "loss": r.loss,
                "macro_f1": evalstats.macro_f1(confusion) if confusion else None,
                "per_class_accuracy": evalstats.per_class_accuracy(confusion) if confusion else None,
            }
        )
    return out


def spread(sites: list[dict[str, Any]]) -> dict[str, Any] | None:
    """How far the sites' accuracies lie apart: min, max, the unweighted mean and the population
    standard deviation over the sites (None without sites)."""
    values = [float(s["accuracy"]) for s in sites]
    if not values:
        return None
    mean = sum(values) / len(values)
    std = (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5
    return {"sites": len(values), "min": min(values), "max": max(values), "mean": mean, "std": std}
