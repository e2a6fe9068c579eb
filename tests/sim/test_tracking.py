"""What `--track mlflow` logs of a finished run (sim/tracking.py), on literal results; the end-to-end
run read back with MLflow's client is in tests/e2e/test_simulate.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from fedprompt.sim.tracking import TrackingError, metrics_of, params_of, parse_track, shown, store_uri

RESULTS = {
    "spec": {"rounds": 2, "lr": 0.01, "aggregation": {"name": "fedavg", "params": {}}, "privacy": None},
    "dataset": "sst2",
    "clients": 3,
    "partition": "label:0.5",
    "initial_accuracy": 0.5,
    "rounds": [
        {
            "round": 1,
            "accuracy": 0.6,
            "macro_f1": 0.55,
            "bytes_up": 100,
            "collapsed": False,
            "sites": [{"name": "site a", "accuracy": 0.7}, {"name": "b:ü", "accuracy": 0.5}],
        },
        {"round": 2, "accuracy": 0.65, "macro_f1": None, "bytes_up": 100},
    ],
    "final_accuracy": 0.65,
    "best_accuracy": 0.65,
    "best_version": 2,
}


def test_the_track_option() -> None:
    assert parse_track(None) is None and parse_track("") is None
    assert parse_track("mlflow") == ("mlflow", None)
    assert parse_track("mlflow:sqlite:///x.db") == ("mlflow", "sqlite:///x.db")
    with pytest.raises(TrackingError, match="one of mlflow"):
        parse_track("wandb")


def test_the_default_store_is_sqlite_in_mlruns(tmp_path: Path) -> None:
    assert store_uri(None, tmp_path) == f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    assert (tmp_path / "mlruns").is_dir()
    assert store_uri("http://tracking:5000", tmp_path) == "http://tracking:5000"


def test_params_and_metrics_of_a_run() -> None:
    params = params_of(RESULTS)
    assert params["spec.rounds"] == "2" and params["spec.lr"] == "0.01"
    assert params["spec.aggregation"] == '{"name": "fedavg", "params": {}}'
    assert "spec.privacy" not in params and params["partition"] == "label:0.5"
    got = metrics_of(RESULTS)
    assert ("accuracy", 0.5, 0) in got and ("accuracy", 0.6, 1) in got and ("accuracy", 0.65, 2) in got
    assert ("site.site a.accuracy", 0.7, 1) in got and ("site.b_ü.accuracy", 0.5, 1) in got
    assert not [m for m in got if m[0] == "macro_f1" and m[2] == 2]  # no value: not logged
    assert not [m for m in got if m[0] == "collapsed"]  # booleans are not metrics
    assert ("best_version", 2.0, 2) in got and ("final_accuracy", 0.65, 2) in got


def test_a_run_written_for_tensorboard_reads_back(tmp_path: Path) -> None:
    from fedprompt.sim.tracking import log_run
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    out.mkdir()
    (out / "results.json").write_text("{}")
    assert parse_track("tensorboard:" + str(tmp_path / "tb")) == ("tensorboard", str(tmp_path / "tb"))
    where = log_run(("tensorboard", str(tmp_path / "tb")), RESULTS, out, None, name="cell-seed-0")
    logdir = tmp_path / "tb" / "cell-seed-0"
    assert where == str(logdir) and (logdir / "results.json").exists()
    events = EventAccumulator(str(logdir))
    events.Reload()
    accuracy = [(e.step, round(e.value, 6)) for e in events.Scalars("accuracy")]
    assert accuracy == [(0, 0.5), (1, 0.6), (2, 0.65)]
    assert [e.value for e in events.Scalars("site.site a.accuracy")] == pytest.approx([0.7])
    assert "params/text_summary" in events.Tags()["tensors"]  # the params table


def test_a_tracking_uri_is_printed_without_its_credentials() -> None:
    assert shown("https://ana:s3cret@mlflow.example:5000/x") == "https://mlflow.example:5000/x"
    assert shown("sqlite:///mlruns/mlflow.db") == "sqlite:///mlruns/mlflow.db"
