"""A bare clone: the committed repository alone, with no data sets beside it and $FEDPROMPT_DATASETS unset.

`fedprompt data list` shows the SST-2 built into the package and where other sets would go; the name
sst2 resolves to that built-in copy, so `make demo` gets past its data (its shards cut from the built-in
SST-2; the demo is stopped there, not run to the end); a set that does not ship (imdb) ends in one line
saying how to get it (exit 2); a user's CSV (string labels, its own column names) federates straight from
the file, without template or label-word flags. The clone's code runs on this checkout's interpreter
(PYTHONPATH), so no new environment is built.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import fixtures

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _csv(path: Path, rows: int) -> Path:
    """A user's sentiment file: a few hundred SST-2 rows as sentence / sentiment with string labels."""
    picked = fixtures.rows("sst2", "train", rows)
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


def _until(args: list[str], clone: Path, env: dict[str, str], wanted: str, timeout: float = 180) -> list[str]:
    """Run a command until a line containing `wanted` (or its end, or the timeout), then stop its process
    group; the lines it printed."""
    proc = subprocess.Popen(
        args, cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        for line in proc.stdout:
            seen.append(line.rstrip("\n"))
            if wanted in line or time.monotonic() > deadline:
                break
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return seen


def test_a_bare_clone_has_the_built_in_sst2_refuses_imdb_in_one_line_and_federates_a_users_csv(
    clone: Path, tmp_path: Path
) -> None:
    env = _env(clone, tmp_path)
    timings: dict[str, float] = {}
    fedprompt = str(BIN / "fedprompt")
    builtin = clone / "worker" / "data" / "builtin"

    # the code that runs is the clone's
    where, _ = _run(
        [sys.executable, "-c", "import fedprompt.sim, fedprompt.worker as w; print(fedprompt.sim.__file__, w.__file__)"],
        clone,
        env,
    )  # fmt: skip
    assert where.stdout.split() == [str(clone / "sim" / "__init__.py"), str(clone / "worker" / "__init__.py")]

    listed, timings["data list"] = _run([fedprompt, "data", "list"], clone, env)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    (sst2,) = [line for line in listed.stdout.splitlines() if line.startswith("sst2 ")]
    assert "train  67,349  test    872" in sst2 and f"(built-in: {builtin})" in sst2
    assert "$FEDPROMPT_DATASETS (unset)" in listed.stdout
    assert str(tmp_path / "xdg" / "fedprompt" / "datasets") in listed.stdout
    assert "fetchable from the Hugging Face hub: imdb," in listed.stdout

    # the name resolves to the clone's built-in copy, the same bytes as this checkout's
    resolved, _ = _run(
        [sys.executable, "-c", "from fedprompt.worker.data import resolve_dataset; print(resolve_dataset('sst2'))"],
        clone,
        env,
    )  # fmt: skip
    assert resolved.stdout.strip() == str(builtin / "sst2"), resolved.stdout + resolved.stderr
    for name in ("train.jsonl.gz", "test.jsonl.gz", "meta.json", "SOURCE.md"):
        assert (builtin / "sst2" / name).read_bytes() == (
            ROOT / "worker" / "data" / "builtin" / "sst2" / name
        ).read_bytes(), name

    missing, timings["simulate --dataset imdb"] = _run(
        [fedprompt, "simulate", "--dataset", "imdb", "--out", str(tmp_path / "nothing")], clone, env
    )
    assert missing.returncode == 2
    lines = (missing.stdout + missing.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no data set named 'imdb'"), lines
    assert (
        "fedprompt data fetch imdb" in lines[0]
        and "$FEDPROMPT_DATASETS" in lines[0]
        and "available: sst2)" in lines[0]
        and "CSV/TSV/JSONL" in lines[0]
    )
    assert "Traceback" not in missing.stderr

    # `make demo` through the clone's Makefile (its venv: this one, never rebuilt) finds the built-in
    # SST-2 and cuts its clients' shards from it; stopped there
    if shutil.which("make"):
        (clone / ".venv").symlink_to(BIN.parent, target_is_directory=True)
        started = time.monotonic()
        demo = _until(["make", "-o", ".venv/.installed", "demo"], clone, env, "client-3:")
        timings["make demo, to its shards"] = time.monotonic() - started
        text = "\n".join(demo)
        assert f"data sst2 (single; labels negative, positive) from {builtin / 'sst2'}" in text, text
        shards = [line for line in demo if line.strip().startswith("client-")]
        assert len(shards) == 4 and sum(int(line.split()[1]) for line in shards) == 8000, text
        assert not any(line.startswith("error:") for line in demo) and "Traceback" not in text

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
