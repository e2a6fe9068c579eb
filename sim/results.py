"""What a simulation writes: results.json, rounds.csv and its figures, one record per closed round.

The communication figures are the coordinator's ledger (coordinator/logic/ledger.py) over the same
rounds, so results.json and the federation's status agree.
"""

from __future__ import annotations

import csv
import json
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedprompt.coordinator.logic.evaluation import BEST_RULE, best_version
from fedprompt.coordinator.logic.ledger import ledger
from fedprompt.shared.local import cpu_model
from fedprompt.shared.privacy import (
    SENSITIVITY_FACTOR,
    gaussian_noise_multiplier,
    gaussian_std,
    laplace_scale,
)
from fedprompt.shared.spec import FederationSpec
from fedprompt.sim.plots import plot_accuracy, plot_asr

# What a run without a backdoor (and without --measure-asr) leaves out: round fields, then run fields.
ASR_ROUND_FIELDS = ("asr", "local_asr", "local_asr_clients", "local_accuracy", "local_accuracy_clients")
ASR_RUN_FIELDS = ("initial_asr", "final_asr")

# The ledger's figures of the model, repeated on every round record and at the top of results.json.
MODEL_LEDGER = ("params_communicated", "params_full_model", "comm_ratio")
CSV_FIELDS = [
    "round",
    "participants",
    "accuracy",
    "macro_f1",
    "loss",
    "eval_loss",
    "bytes_up",
    "bytes_down",
    "seconds",
    "elapsed_s",
    "asr",
    "local_asr",
    "local_accuracy",
    "epsilon",
    "epsilon_cumulative",
    "site_min_accuracy",
    "site_max_accuracy",
    "site_std_accuracy",
]


def communication(spec: dict[str, Any], closed: list[dict[str, Any]]) -> dict[str, Any]:
    """The ledger of these closed rounds under the spec's parameter counts."""
    parsed = FederationSpec.model_validate(spec)
    return ledger(
        [(r["round"], r["stats"]) for r in closed],
        params_per_client=parsed.params_communicated(),
        params_full_model=parsed.params_full_model,
    )


def model_ledger(spec: dict[str, Any]) -> dict[str, Any]:
    """params_communicated (per client and direction), params_full_model and comm_ratio of a spec."""
    book = communication(spec, [])
    return {key: book[key] for key in MODEL_LEDGER}


def round_records(rounds: list[dict[str, Any]], spec: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One record per closed round, in the shape results.json promises. `elapsed_s` is when the round
    closed, in seconds from the opening of the first round (every client enrolled): the time axis on
    which mode async and rounds compare (a run continued later counts the pause too)."""
    closed = [r for r in rounds if r["state"] == "closed"]
    opened = [r["opened_at"] for r in rounds if r.get("opened_at") is not None]
    start = min(opened) if opened else None
    book = communication(spec, closed) if spec is not None else None
    per_model = {key: book[key] for key in MODEL_LEDGER} if book else {}
    entries = book["rounds"] if book else [{"params_up": 0, "params_down": 0}] * len(closed)
    out = []
    for r, entry in zip(closed, entries, strict=True):
        ev = r.get("evaluation") or {}
        stats = r["stats"]
        elapsed = None if start is None or r.get("closed_at") is None else r["closed_at"] - start
        out.append(
            {
                "round": r["round"],
                "attempt": r["attempt"],
                # mode async: the updates the buffer held (its tasks may have come from earlier buffers)
                "participants": (stats.get("buffer") or {}).get(
                    "updates", stats.get("participants", len(r["participants"]))
                ),
                "accuracy": ev.get("accuracy"),
                "macro_f1": ev.get("macro_f1"),
                "collapsed": bool(ev.get("collapsed")),
                "per_class_accuracy": ev.get("per_class_accuracy"),
                "confusion": ev.get("confusion"),
                "eval_loss": ev.get("loss"),
                "eval_clients": ev.get("clients", 0),
                "eval_samples": ev.get("num_samples", 0),
                "loss": stats.get("train_loss"),
                "local_steps": stats.get("local_steps"),
                "bytes_up": stats.get("bytes_up", 0),
                "bytes_down": stats.get("bytes_down", 0),
                "seconds": r.get("seconds"),
                "elapsed_s": elapsed,
                "asr": ev.get("asr"),
                "local_asr": _mean(list((stats.get("local_asr") or {}).values())),
                "local_asr_clients": stats.get("local_asr") or {},
                "local_accuracy": _mean(list((stats.get("local_accuracy") or {}).values())),
                "local_accuracy_clients": stats.get("local_accuracy") or {},
                "epsilon": (stats.get("privacy") or {}).get("epsilon"),
                "epsilon_cumulative": (stats.get("privacy") or {}).get("max_cumulative_epsilon"),
                "notes": stats.get("notes") or {},
                **per_model,
                "params_up": entry["params_up"],
                "params_down": entry["params_down"],
            }
        )
    return out


def best_of(records: list[dict[str, Any]], initial: dict[str, Any] | None) -> dict[str, Any]:
    """results.json's best_* fields: the best evaluated version (round 0 included) by the
    coordinator's rule (coordinator/logic/evaluation.py BEST_RULE), which `fedprompt prompt get` and
    the PEFT export hand out by default. In a simulation the clients evaluate on shares of the test
    split, so the best version is chosen on the data it is reported on: an upper estimate."""
    start = initial_record(initial)
    rows = ([start] if start else []) + records
    summaries = [
        {
            "version": r["round"],
            "accuracy": r["accuracy"],
            "macro_f1": r.get("macro_f1"),
            "confusion": r.get("confusion"),
            "per_class_samples": [sum(row) for row in r.get("confusion") or []],
        }
        for r in rows
        if r.get("accuracy") is not None
    ]
    best = best_version(summaries)
    if best is None:
        return {}
    row = next(r for r in rows if r["round"] == best["version"])
    return {
        "best_version": best["version"],
        "best_accuracy": row["accuracy"],
        "best_macro_f1": row.get("macro_f1"),
        "best_rule": BEST_RULE,
    }


def attach_sites(records: list[dict[str, Any]], fetch: Callable[[int], dict[str, Any] | None]) -> None:
    """Each record's per-site evaluation (`sites`: every site's accuracy, macro-F1 and examples) and
    their spread (`site_min_accuracy`, `site_max_accuracy`, `site_std_accuracy`), from `fetch(version)`; a record whose sites
    cannot be had (secure aggregation keeps them private) gets none."""
    for record in records:
        got = fetch(record["round"])
        if not got or not got.get("sites"):
            continue
        record["sites"] = [
            {k: site.get(k) for k in ("name", "num_samples", "accuracy", "macro_f1")} for site in got["sites"]
        ]
        spread = got.get("spread") or {}
        record |= {f"site_{k}_accuracy": spread.get(k) for k in ("min", "max", "std")}


def initial_record(initial: dict[str, Any] | None) -> dict[str, Any] | None:
    """Round 0 in the shape of a round record: the starting prompt's evaluation, nothing trained or
    sent (None before any client reported it)."""
    if not initial or initial.get("accuracy") is None:
        return None
    return {
        "round": 0,
        "attempt": 0,
        "participants": 0,
        "accuracy": initial.get("accuracy"),
        "macro_f1": initial.get("macro_f1"),
        "collapsed": bool(initial.get("collapsed")),
        "per_class_accuracy": initial.get("per_class_accuracy"),
        "confusion": initial.get("confusion"),
        "eval_loss": initial.get("loss"),
        "eval_clients": initial.get("clients", 0),
        "eval_samples": initial.get("num_samples", 0),
        "loss": None,
        "bytes_up": 0,
        "bytes_down": 0,
        "seconds": None,
        "elapsed_s": 0.0,  # the starting prompt is there from the start
        "asr": initial.get("asr"),
        "local_asr": None,
        "local_accuracy": None,
        "epsilon": None,
        "epsilon_cumulative": None,
    }


def measured_asr(records: list[dict[str, Any]], initial: dict[str, Any] | None = None) -> bool:
    """True when some client reported an ASR (global or local): a backdoor was configured, or the
    operator asked for the clean-trigger measurement (--measure-asr)."""
    return (initial or {}).get("asr") is not None or any(
        r.get("asr") is not None or r.get("local_asr") is not None for r in records
    )


def without_asr(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The round records without their (empty) ASR fields."""
    return [{k: v for k, v in r.items() if k not in ASR_ROUND_FIELDS} for r in records]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def run_facts(
    spec: dict[str, Any], setup: dict[str, Any], *, parallel: int, cores: int, device: str
) -> dict[str, Any]:
    """What results.json says about the run besides its rounds: the set-up, the machine, the ledger."""
    return {
        "federation_id": setup["federation_id"],
        "dataset": Path(setup["dataset"]).name,
        "labels": _labels(setup["dataset"]),
        "clients": int(setup["clients"]),
        "partition": setup["partition"],
        "train_limit": setup.get("train_limit"),
        "eval_limit": setup.get("eval_limit"),
        "backdoor": setup.get("backdoor"),
        "init_prompt": setup.get("init_prompt"),
        "client_speed": setup.get("client_speed"),
        "slowdowns": setup.get("slowdowns"),
        "parallel": parallel,
        "environment": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpu_count": cores,
            "cpu_model": cpu_model(),
            "device": device,
            "torch": _torch_version(),
        },
        **model_ledger(spec),
        **ldp_facts(spec),
        "scoring": SCORING_TEXT[spec.get("scoring", "auto")],
    }


SCORING_TEXT = {
    "mean-pool": "mean-pool similarity: 20 × cosine of the mean-pooled output with each label phrase "
    "(the checkpoint has no MLM head)",
    "tied-embeddings": "label words at [MASK] read through the tied input embeddings",
    "auto": "label words through the model's LM / MLM head",
}


def ldp_facts(spec: dict[str, Any]) -> dict[str, Any]:
    """results.json's `ldp` block when the federation asks for LDP: the settings and the calibration
    (sensitivity 2 × clip, the noise's scale or std per element); nothing without LDP."""
    privacy = spec.get("privacy")
    if not privacy:
        return {}
    clip, epsilon, mechanism = float(privacy["clip"]), float(privacy["epsilon"]), privacy["mechanism"]
    facts = {**privacy, "sensitivity": SENSITIVITY_FACTOR * clip}
    if mechanism == "gaussian":
        sigma = gaussian_noise_multiplier(epsilon, float(privacy["delta"]))
        facts |= {"noise_multiplier": sigma, "noise_std": gaussian_std(clip, sigma)}
    else:
        facts["noise_scale"] = laplace_scale(clip, epsilon)
    return {"ldp": facts}


def _labels(folder: str) -> list[str] | None:
    """The label names of the packed data set a run used (its meta.json), index = label id."""
    try:
        return list(json.loads((Path(folder) / "meta.json").read_text(encoding="utf-8"))["labels"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def per_class_columns(labels: list[str] | None, records: list[dict[str, Any]]) -> dict[str, int]:
    """rounds.csv's per-class accuracy columns (accuracy_<label name>) and the label id of each."""
    k = max((len(r.get("per_class_accuracy") or []) for r in records), default=0)
    names = labels if labels is not None and len(labels) == k else [str(i) for i in range(k)]
    return {f"accuracy_{name}": i for i, name in enumerate(names)}


def _torch_version() -> str:
    try:
        import torch

        return torch.__version__
    except ImportError:
        return "absent"


def write_results(
    out: Path,
    spec: dict[str, Any],
    records: list[dict[str, Any]],
    initial: dict[str, Any] | None,
    wall: float,
    extra: dict[str, Any],
) -> dict[str, Any]:
    """results.json, rounds.csv and accuracy.png (asr.png too when there is an ASR) in `out`. A run in
    which no client measured the ASR has no ASR field in results.json nor column in rounds.csv."""
    asr = measured_asr(records, initial)
    records = records if asr else without_asr(records)
    best = best_of(records, initial)
    results = {
        "spec": spec,
        "rounds": records,
        "initial_accuracy": (initial or {}).get("accuracy"),
        "final_accuracy": records[-1]["accuracy"] if records else None,
        "final_macro_f1": records[-1].get("macro_f1") if records else None,
        "final_collapsed": bool(records and records[-1].get("collapsed")),
        **best,
        "initial_asr": (initial or {}).get("asr"),
        "final_asr": records[-1].get("asr") if records else None,
        "total_bytes_up": sum(r["bytes_up"] for r in records),
        "total_bytes_down": sum(r["bytes_down"] for r in records),
        "wall_seconds": wall,
        **extra,
    }
    if not asr:
        results = {k: v for k, v in results.items() if k not in ASR_RUN_FIELDS}
    (out / "results.json").write_text(json.dumps(results, indent=2))
    per_class = per_class_columns(results.get("labels"), records)
    with open(out / "rounds.csv", "w", newline="") as fh:
        fields = [f for f in CSV_FIELDS if asr or f not in ASR_ROUND_FIELDS]
        writer = csv.DictWriter(fh, fieldnames=fields + list(per_class), extrasaction="ignore")
        writer.writeheader()
        start = initial_record(initial)  # round 0: the starting prompt
        for record in ([start] if start else []) + records:
            accuracies = record.get("per_class_accuracy") or []
            columns = {c: accuracies[i] if i < len(accuracies) else None for c, i in per_class.items()}
            writer.writerow(record | columns)
    plot_accuracy(out / "accuracy.png", results)
    if asr:
        plot_asr(out / "asr.png", results)
    return results
