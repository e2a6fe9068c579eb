"""A bare clone: the committed repository alone, with no data sets beside it and $FEDPROMPT_DATASETS unset.

`fedprompt data list` says none are installed and where they would go; `make demo` and `fedprompt
simulate --dataset sst2` end with one line saying how to get the data (exit 2); a user's CSV (string
labels, its own column names) federates straight from the file, without template or label-word flags.
The clone's code runs on this checkout's interpreter (PYTHONPATH), so no new environment is built.
"""

from __future__ import annotations

import csv
import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fedprompt.worker.data import datasets_dir

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _csv(path: Path, rows: int) -> Path:
    """A user's sentiment file: a few hundred SST-2 rows as sentence / sentiment with string labels."""
    with gzip.open(datasets_dir() / "sst2" / "train.jsonl.gz", "rt", encoding="utf-8") as fh:
        picked = [json.loads(line) for line, _ in zip(fh, range(rows), strict=False)]
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["sentence", "sentiment"])
        writer.writerows([r["text"], ["negative", "positive"][r["label"]]] for r in picked)
    return path


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The committed repository cloned alone into an empty folder (no sibling shared/)."""
    where = tmp_path_factory.mktemp("bare") / "fedprompt"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(where)], check=True, timeout=120)
    assert not (where.parent / "shared").exists()
    return where


def _env(clone: Path, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "FEDPROMPT_DATASETS" and not k.startswith("PYTEST")}
    return env | {
        "PYTHONPATH": str(clone),
        "XDG_DATA_HOME": str(home / "xdg"),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "COLUMNS": "200",
    }


def _run(
    args: list[str], clone: Path, env: dict[str, str], timeout: float = 120
) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run(args, cwd=clone, env=env, capture_output=True, text=True, timeout=timeout)
    return done, time.monotonic() - started


def test_a_bare_clone_lists_no_data_refuses_sst2_in_one_line_and_federates_a_users_csv(
    clone: Path, tmp_path: Path
) -> None:
    env = _env(clone, tmp_path)
    timings: dict[str, float] = {}
    fedprompt = str(BIN / "fedprompt")

    # the code that runs is the clone's
    where, _ = _run(
        [sys.executable, "-c", "import sim, worker; print(sim.__file__, worker.__file__)"], clone, env
    )
    assert where.stdout.split() == [str(clone / "sim" / "__init__.py"), str(clone / "worker" / "__init__.py")]

    listed, timings["data list"] = _run([fedprompt, "data", "list"], clone, env)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert "no data sets installed" in listed.stdout and "$FEDPROMPT_DATASETS (unset)" in listed.stdout
    assert str(tmp_path / "xdg" / "fedprompt" / "datasets") in listed.stdout

    missing, timings["simulate --dataset sst2"] = _run(
        [fedprompt, "simulate", "--dataset", "sst2", "--out", str(tmp_path / "nothing")], clone, env
    )
    assert missing.returncode == 2
    lines = (missing.stdout + missing.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no data set named 'sst2'"), lines
    assert (
        "fedprompt data fetch sst2" in lines[0]
        and "$FEDPROMPT_DATASETS" in lines[0]
        and "CSV/TSV/JSONL" in lines[0]
    )
    assert "Traceback" not in missing.stderr

    # `make demo` through the clone's Makefile (its venv: this one, never rebuilt)
    if shutil.which("make"):
        (clone / ".venv").symlink_to(BIN.parent, target_is_directory=True)
        demo, timings["make demo"] = _run(["make", "-o", ".venv/.installed", "demo"], clone, env)
        assert demo.returncode == 2, demo.stdout + demo.stderr
        ours = [line for line in (demo.stdout + demo.stderr).splitlines() if line.startswith("error:")]
        assert len(ours) == 1 and "no data set named 'sst2'" in ours[0] and "Traceback" not in demo.stderr

    data = _csv(tmp_path / "reviews.csv", 300)
    out = tmp_path / "run"
    federated, timings["simulate a CSV, 1 round"] = _run(
        [
            fedprompt,
            "simulate",
            "--data",
            str(data),
            "--text-column",
            "sentence",
            "--label-column",
            "sentiment",
            "--clients",
            "2",
            "--fraction",
            "1",
            "--rounds",
            "1",
            "--local-steps",
            "3",
            "--batch-size",
            "8",
            "--max-length",
            "32",
            "--parallel",
            "2",
            "--out",
            str(out),
        ],  # fmt: skip
        clone,
        env,
        timeout=600,
    )
    assert federated.returncode == 0, federated.stdout + federated.stderr
    text = federated.stdout
    assert "data reviews (single; labels negative, positive)" in text
    assert "template '{text} It was [MASK].', label words negative; positive" in text
    assert "client-0:" in text and "client-1:" in text and "done in" in text
    results = json.loads((out / "results.json").read_text())
    assert results["dataset"] == "reviews" and results["labels"] == ["negative", "positive"]
    assert results["spec"]["verbalizer"] == [["negative"], ["positive"]]
    (record,) = results["rounds"]
    assert record["eval_samples"] == 30 and len(record["per_class_accuracy"]) == 2
    assert record["macro_f1"] is not None
    header = (out / "rounds.csv").read_text().splitlines()[0].split(",")
    assert {"macro_f1", "accuracy_negative", "accuracy_positive"} <= set(header)
    print("\nbare clone timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))
