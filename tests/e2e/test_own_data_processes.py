"""One's own file through `fedprompt-worker train-local` and `fedprompt simulate` as a user runs them: string
labels and its own column names, no template or label-word flags; a label name of several word pieces is one
line of error; train-local without a terminal prints progress lines, and Ctrl-C / SIGTERM stop it and write
what was measured."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import fixtures

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent
WORKER, FEDPROMPT = str(BIN / "fedprompt-worker"), str(BIN / "fedprompt")
COLUMNS = ["--text-column", "sentence", "--label-column", "sentiment"]


def _csv(path: Path, rows: int, names: tuple[str, str]) -> Path:
    picked = fixtures.rows("sst2", "train", rows)
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["sentence", "sentiment"])
        writer.writerows([r["text"], names[r["label"]]] for r in picked)
    return path


def test_train_local_from_a_users_csv_with_progress_lines(tmp_path: Path) -> None:
    data = _csv(tmp_path / "reviews.csv", 200, ("negative", "positive"))
    out = tmp_path / "local.json"
    args = [WORKER, "train-local", "--data", str(data), *COLUMNS, "--steps", "4", "--batch-size", "4",
            "--max-length", "32", "--eval-every", "2", "--log-every", "2", "--out", str(out)]  # fmt: skip

    done = subprocess.run(args, capture_output=True, text=True, timeout=300)

    assert done.returncode == 0, done.stdout + done.stderr
    assert "reviews: 180 train / 20 test (test: a seeded 10 % held out of the file)" in done.stdout
    assert "template '{text} It was [MASK].' verbalizer [['negative'], ['positive']]" in done.stdout
    assert "step 2/4 loss" in done.stdout and "step 4/4 loss" in done.stdout
    assert "step 2: accuracy=" in done.stdout and "macro-F1=" in done.stdout
    report = json.loads(out.read_text())
    assert (report["dataset"], report["labels"], report["held_out"]) == (
        "reviews",
        ["negative", "positive"],
        True,
    )
    assert report["steps_done"] == 4 and "stopped" not in report
    assert [p["step"] for p in report["curve"]] == [0, 2, 4] and report["final_macro_f1"] is not None


def test_a_label_name_of_several_word_pieces_is_one_line_in_both_commands(tmp_path: Path) -> None:
    data = _csv(tmp_path / "mail.csv", 60, ("ham", "spam"))
    commands = {
        "simulate": [FEDPROMPT, "simulate", "--data", str(data), *COLUMNS, "--out", str(tmp_path / "run")],
        "train-local": [WORKER, "train-local", "--data", str(data), *COLUMNS, "--steps", "1"],
    }
    for name, args in commands.items():
        done = subprocess.run(args, capture_output=True, text=True, timeout=120)
        lines = (done.stdout + done.stderr).strip().splitlines()
        assert done.returncode == 2, (name, lines)
        assert len(lines) == 1 and lines[0].startswith("error: label 'spam' is 2 word pieces"), (name, lines)
        assert "(spa ##m)" in lines[0] and "--verbalizer 'normal;junk'" in lines[0], name
    # with single-piece words it trains
    ok = subprocess.run([*commands["train-local"], "--verbalizer", "normal;junk", "--eval-limit", "4"],
                        capture_output=True, text=True, timeout=300)  # fmt: skip
    assert ok.returncode == 0, ok.stdout + ok.stderr


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_train_local_stops_on_a_signal_and_writes_what_was_measured(
    tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    data = _csv(tmp_path / "reviews.csv", 200, ("negative", "positive"))
    out = tmp_path / "local.json"
    args = [WORKER, "train-local", "--data", str(data), *COLUMNS, "--steps", "100000", "--batch-size", "2",
            "--max-length", "16", "--eval-every", "0", "--log-every", "1", "--out", str(out)]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    seen = []
    deadline = time.monotonic() + 180
    for line in proc.stdout:  # wait until training runs
        seen.append(line)
        if line.startswith("step 3/") or time.monotonic() > deadline:
            break
    proc.send_signal(sig)
    rest, _ = proc.communicate(timeout=120)
    output = "".join(seen) + rest

    assert proc.returncode == code, output
    assert f"stopped by {sig.name} at step" in output and f"wrote {out}" in output
    report = json.loads(out.read_text())
    assert report["stopped"]["signal"] == sig.name and report["stopped"]["at_step"] >= 3
    assert report["steps_done"] >= 3 and report["curve"][0]["step"] == 0  # the zero-shot evaluation
