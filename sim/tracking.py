"""Experiment tracking: a finished simulation logged to MLflow or TensorBoard (`fedprompt simulate
--track`).

The run holds the spec and the set-up as params, every round's global and per-site figures as metrics
(step = the prompt version: 0 is the initial prompt), the final and best figures, and the run's files:
results.json, rounds.csv, the figures, and the best prompt as a PEFT adapter folder.

- `mlflow[:URI]`: one MLflow run (the `tracking` extra, mlflow-skinny). Without a URI it goes to a
  SQLite store in ./mlruns (mlruns/mlflow.db, artifacts beside it): local and offline;
  `mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db` shows it.
- `tensorboard[:DIR]`: event files in DIR/<run name> (default ./tensorboard), written with torch's
  SummaryWriter (the `tracking` extra brings tensorboard); the params as a text summary, the run's
  files and the adapter copied beside the events. `tensorboard --logdir DIR` shows it.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

TRACKERS = ("mlflow", "tensorboard")
DEFAULT_STORE = Path("mlruns")
DEFAULT_LOGDIR = Path("tensorboard")
RUN_FILES = ("results.json", "rounds.csv", "accuracy.png", "asr.png")
EXPERIMENT = "fedprompt"
# the round records' numbers logged per round (the ledger's and privacy's included)
ROUND_METRICS = (
    "accuracy",
    "macro_f1",
    "eval_loss",
    "loss",
    "bytes_up",
    "bytes_down",
    "asr",
    "epsilon_cumulative",
    "site_min_accuracy",
    "site_max_accuracy",
    "site_std_accuracy",
)
RUN_METRICS = (
    "final_accuracy",
    "final_macro_f1",
    "best_accuracy",
    "best_macro_f1",
    "best_version",
    "wall_seconds",
)


class TrackingError(ValueError):
    """A --track value that cannot be used, or MLflow missing."""


def parse_track(text: str | None) -> tuple[str, str | None] | None:
    """'mlflow' or 'mlflow:URI' → ("mlflow", URI or None); None → None."""
    if text is None or not text.strip():
        return None
    kind, _, uri = text.strip().partition(":")
    if kind not in TRACKERS:
        raise TrackingError(
            f"--track {text!r}: the tracker is one of {', '.join(TRACKERS)} (e.g. mlflow, mlflow:URI, "
            "tensorboard:DIR)"
        )
    return kind, (uri or None)


def store_uri(uri: str | None, cwd: Path) -> str:
    """The MLflow tracking URI: as given, or a SQLite store in ./mlruns."""
    if uri:
        return uri
    folder = (cwd / DEFAULT_STORE).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'mlflow.db'}"


def shown(uri: str) -> str:
    """A tracking URI as it may be printed: without the user and password it may carry."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(uri)
    if parts.username is None and parts.password is None:
        return uri
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit(parts._replace(netloc=netloc))


def params_of(results: Mapping[str, Any]) -> dict[str, str]:
    """The run's params: the spec's scalar fields (nested ones as JSON) and the set-up's."""
    spec = results.get("spec") or {}
    out: dict[str, str] = {}
    for key, value in spec.items():
        if value is None or key in ("model_info", "verbalizer", "labels"):
            continue
        out[f"spec.{key}"] = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    for key in (
        "dataset",
        "clients",
        "partition",
        "client_speed",
        "train_limit",
        "eval_limit",
        "parallel",
        "processes",
    ):
        if results.get(key) is not None:
            out[key] = str(results[key])
    return {k: str(v)[:500] for k, v in out.items()}  # MLflow's limit on a param's value


def metrics_of(results: Mapping[str, Any]) -> list[tuple[str, float, int]]:
    """(name, value, step) of every round's figures, each site's accuracy and the run's results."""
    out: list[tuple[str, float, int]] = []
    if results.get("initial_accuracy") is not None:
        out.append(("accuracy", float(results["initial_accuracy"]), 0))
    for record in results.get("rounds") or []:
        step = int(record["round"])
        for key in ROUND_METRICS:
            value = record.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                out.append((key, float(value), step))
        for site in record.get("sites") or []:
            if isinstance(site.get("accuracy"), int | float):
                out.append((f"site.{_safe(site['name'])}.accuracy", float(site["accuracy"]), step))
    last = int((results.get("rounds") or [{"round": 0}])[-1]["round"])
    for key in RUN_METRICS:
        value = results.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out.append((key, float(value), last))
    return out


def _safe(name: str) -> str:
    """A site name as MLflow takes it in a metric key (letters, digits, _ - . / and spaces)."""
    return "".join(ch if ch.isalnum() or ch in "_-. /" else "_" for ch in str(name))[:100]


def log_run(
    track: tuple[str, str | None],
    results: Mapping[str, Any],
    out: Path,
    adapter_zip: bytes | None,
    *,
    name: str,
) -> str:
    """Log a finished simulation to the tracker; where it went (an MLflow run id, a log folder)."""
    if track[0] == "tensorboard":
        return str(log_tensorboard(Path(track[1] or DEFAULT_LOGDIR) / name, results, out, adapter_zip))
    return log_mlflow(track, results, out, adapter_zip, name=name)


def log_tensorboard(logdir: Path, results: Mapping[str, Any], out: Path, adapter_zip: bytes | None) -> Path:
    """The run as TensorBoard event files in `logdir`, its files and adapter beside them."""
    import shutil

    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise TrackingError(
            "--track tensorboard needs TensorBoard: pip install 'fedprompt[tracking]'"
        ) from None
    from fedprompt.shared.export import unpack

    logdir.mkdir(parents=True, exist_ok=True)
    with SummaryWriter(log_dir=str(logdir)) as writer:
        table = "\n".join(f"| {k} | {v} |" for k, v in sorted(params_of(results).items()))
        writer.add_text("params", "| param | value |\n|---|---|\n" + table, 0)
        for key, value, step in metrics_of(results):
            writer.add_scalar(key, value, step)
    for file in RUN_FILES:
        if (out / file).exists():
            shutil.copy2(out / file, logdir / file)
    if adapter_zip is not None:
        unpack(adapter_zip, logdir / "adapter")
    return logdir


def log_mlflow(
    track: tuple[str, str | None],
    results: Mapping[str, Any],
    out: Path,
    adapter_zip: bytes | None,
    *,
    name: str,
) -> str:
    """Log a finished simulation as one MLflow run; its run id."""
    try:
        import mlflow
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise TrackingError(
            "--track mlflow needs MLflow: pip install 'fedprompt[tracking]' (mlflow-skinny)"
        ) from None
    from fedprompt.shared.export import unpack
    from mlflow.entities import Metric, Param

    uri = store_uri(track[1], Path(os.getcwd()))
    client = MlflowClient(uri)
    mlflow.set_tracking_uri(uri)
    experiment = mlflow.set_experiment(EXPERIMENT)
    run = client.create_run(experiment.experiment_id, run_name=name)
    rid = run.info.run_id
    try:
        params = [Param(k, v) for k, v in sorted(params_of(results).items())]
        metrics = [Metric(k, v, 0, step) for k, v, step in metrics_of(results)]
        for start in range(0, max(len(params), len(metrics)), 100):  # MLflow's batch limits
            client.log_batch(rid, metrics=metrics[start : start + 100], params=params[start : start + 100])
        for file in RUN_FILES:
            if (out / file).exists():
                client.log_artifact(rid, str(out / file))
        if adapter_zip is not None:
            with tempfile.TemporaryDirectory() as tmp:
                folder = Path(tmp) / "adapter"
                unpack(adapter_zip, folder)
                client.log_artifacts(rid, str(folder), artifact_path="adapter")
        client.set_terminated(rid, "FINISHED")
    except Exception:
        client.set_terminated(rid, "FAILED")
        raise
    return rid
