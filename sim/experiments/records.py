"""An experiment's records: per-cell metrics from each cell's results.json, merged with the committed
summary (docs/results/<name>.json), and the metrics as the tables show them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fedprompt.sim.experiments.config import ExperimentConfig, expand
from fedprompt.sim.experiments.runner import (
    committed_cells,
    committed_match,
    holds_every_round,
    normalised,
    outdated,
    ran_with_other_options,
    start_prompt_sha,
)

# Per-round fields a summary keeps of each cell (its results.json has more).
ROUND_FIELDS = ("round", "accuracy", "asr", "local_asr", "local_accuracy", "epsilon_cumulative")


def cell_metrics(results: dict[str, Any]) -> dict[str, Any]:
    """The numbers a table can show, from one simulate results.json."""
    rounds = results.get("rounds") or []
    asrs = [r["asr"] for r in rounds if r.get("asr") is not None]
    local = [r["local_asr"] for r in rounds if r.get("local_asr") is not None]
    local_acc = [r["local_accuracy"] for r in rounds if r.get("local_accuracy") is not None]
    last = rounds[-1] if rounds else {}
    initial, final = results.get("initial_accuracy"), results.get("final_accuracy")
    return {
        "initial_accuracy": initial,
        "final_accuracy": final,
        # what the rounds added to the starting prompt (final − initial)
        "accuracy_gain": final - initial if final is not None and initial is not None else None,
        "initial_asr": results.get("initial_asr"),
        "final_asr": results.get("final_asr"),
        "max_asr": max(asrs) if asrs else None,
        "local_asr": sum(local) / len(local) if local else None,
        "max_local_asr": max(local) if local else None,
        "local_accuracy": sum(local_acc) / len(local_acc) if local_acc else None,
        "epsilon": last.get("epsilon"),
        "epsilon_cumulative": last.get("epsilon_cumulative"),
        "rejected": sum(len(r.get("notes") or {}) for r in rounds),
        "rounds": len(rounds),
        "wall_seconds": results.get("wall_seconds"),
        # parameters one client uploads per round (the method's trainable prompt parameters)
        "params_sent": results.get("params_communicated"),
        "final_macro_f1": last.get("macro_f1"),
        "majority_rate": majority_rate(last.get("confusion")),
        "num_classes": len(last["confusion"]) if last.get("confusion") else None,
        "best_accuracy": results.get("best_accuracy"),
        "best_macro_f1": results.get("best_macro_f1"),
        "collapsed": 1.0 if last.get("collapsed") else 0.0 if last else None,
    }


def majority_rate(confusion: list[list[int]] | None) -> float | None:
    """The accuracy of always answering the most frequent true label of the evaluated examples
    (rows of the confusion matrix are true labels): the figure an accuracy must beat to mean learning."""
    if not confusion:
        return None
    totals = [sum(row) for row in confusion]
    return max(totals) / sum(totals) if sum(totals) else None


def collect(config: ExperimentConfig, out_root: Path) -> list[dict[str, Any]]:
    """One record per cell: params, metrics when the cell finished, its command and wall time."""
    records = []
    for cell in expand(config):
        folder = out_root / config.name / cell.id
        record: dict[str, Any] = {
            "cell": cell.id,
            "params": cell.params,
            "seed": cell.seed,
            "options": normalised(cell.options),
            "done": False,
        }
        results_path, meta_path = folder / "results.json", folder / "cell.json"
        if ran_with_other_options(folder, cell.options):  # the config changed since it ran
            records.append(record)
            continue
        results = json.loads(results_path.read_text()) if results_path.exists() else None
        if results is not None and holds_every_round(results, cell.options):
            record |= {"done": True, "metrics": cell_metrics(results)}
            record["rounds"] = [{k: r.get(k) for k in ROUND_FIELDS} for r in results.get("rounds", [])]
            if results.get("ldp"):  # the calibration this build's LDP used (see shared/privacy.py)
                record["ldp_sensitivity"] = results["ldp"].get("sensitivity")
            # how labels were read (the spec resolves `auto` to what the engine used)
            record["scoring"] = (results.get("spec") or {}).get("scoring", "tied-embeddings")
        if meta_path.exists():
            meta = json.loads(meta_path.read_text())
            record["command"] = meta.get("command")
            record["wall_seconds"] = meta.get("wall_seconds")
            if meta.get("same_as"):  # taken from another experiment's identical cell (runner.find_twin)
                record["same_as"] = meta["same_as"]
            start = (meta.get("options") or {}).get("init_prompt")
            record["start_sha256"] = meta.get("start_sha256") or start_prompt_sha(start)
        records.append(record)
    return records


def merge_committed(
    config: ExperimentConfig,
    records: list[dict[str, Any]],
    committed: dict[str, dict[str, Any]],
    out_root: Path,
) -> list[dict[str, Any]]:
    """Cells not finished in the runs folder but finished in the committed summary (another machine,
    an earlier session) keep their committed record, unless this machine's starting prompt for the
    cell is known and is not the one the committed cell started from; a cell rerun here replaces it."""
    merged = []
    for cell, record in zip(expand(config), records, strict=True):
        previous = None if record["done"] else committed_match(committed, config, cell, out_root)
        merged.append({**previous, "options": record["options"]} if previous is not None else record)
    return merged


def records_of(config: ExperimentConfig, out_root: Path, fig_dir: Path) -> list[dict[str, Any]]:
    """Every cell's record: run here (out_root), else from the committed summary."""
    return merge_committed(config, collect(config, out_root), committed_cells(fig_dir, config.name), out_root)


# -- numbers ---------------------------------------------------------------------------------------


def metrics_of(record: dict[str, Any]) -> dict[str, Any]:
    """A finished record's metrics as the tables show them: with the LDP noise per element, and for a
    cell measured before LDP was calibrated to the sensitivity 2 × clip, the ε its releases in fact
    guaranteed (shared.privacy.uncalibrated_epsilon) instead of the ε it was run at."""
    from fedprompt.shared.privacy import (
        SENSITIVITY_FACTOR,
        gaussian_noise_multiplier,
        gaussian_std,
        laplace_scale,
        spent_epsilon,
        uncalibrated_epsilon,
    )

    metrics = dict(record.get("metrics") or {})
    options = record.get("options") or {}
    epsilon, clip = options.get("ldp_epsilon"), options.get("ldp_clip")
    if epsilon is None or clip is None:
        return metrics
    mechanism = options.get("ldp_mechanism") or "laplace"
    delta = options.get("ldp_delta")
    epsilon, clip = float(epsilon), float(clip)
    if mechanism == "gaussian":
        if delta is None:  # the spec requires δ with the Gaussian mechanism
            raise ValueError(f"cell {record.get('cell')!r}: the Gaussian mechanism without ldp_delta")
        noise = gaussian_std(clip, gaussian_noise_multiplier(epsilon, float(delta)))
    else:
        noise = laplace_scale(clip, epsilon)
    if outdated(record, options) is None:
        return metrics | {"noise": noise}
    metrics["noise"] = noise / SENSITIVITY_FACTOR
    metrics["epsilon"] = uncalibrated_epsilon(mechanism, epsilon, delta, 1)
    spent = metrics.get("epsilon_cumulative")
    if spent is not None:
        rounds = max(1, int(metrics.get("rounds") or 1))
        releases = min(
            range(1, rounds + 1), key=lambda n: abs(spent_epsilon(mechanism, epsilon, delta, n) - spent)
        )
        metrics["epsilon_cumulative"] = uncalibrated_epsilon(mechanism, epsilon, delta, releases)
    return metrics
