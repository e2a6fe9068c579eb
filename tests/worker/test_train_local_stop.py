"""`fedprompt-worker train-local` stopped by SIGTERM (issue 34): it writes what it measured, labelled
partial, and never the start's (step 0) accuracy as its final one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import wait_for

WORKER = str(Path(sys.executable).parent / "fedprompt-worker")


@pytest.mark.skipif(
    not os.environ.get("FEDPROMPT_DATASETS"), reason="needs the packed SST-2 ($FEDPROMPT_DATASETS)"
)
def test_a_stopped_train_local_writes_a_partial_report_without_a_final_accuracy(tmp_path: Path) -> None:
    out = tmp_path / "baseline.json"
    log = tmp_path / "train-local.log"
    cmd = [WORKER, "train-local", "--dataset", "sst2", "--steps", "100000", "--batch-size", "2"]
    cmd += ["--train-limit", "64", "--eval-limit", "16", "--eval-every", "0", "--max-length", "24"]
    cmd += ["--threads", "1", "--log-every", "5", "--out", str(out)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
        try:
            wait_for(lambda: "step 5/100000" in log.read_text() or proc.poll() is not None, 300, "training")
            wait_for(lambda: "zero-shot" in log.read_text(), 10, "the start's evaluation")
            time.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
    text = log.read_text()
    assert code == 143, text
    assert "Traceback" not in text
    report = json.loads(out.read_text())
    assert report["status"] == "partial" and report["stopped"]["signal"] == "SIGTERM"
    assert report["final_accuracy"] is None and report["final_macro_f1"] is None
    assert report["initial_accuracy"] == report["curve"][0]["accuracy"]
    assert report["last_evaluation"]["step"] == 0 and report["steps_done"] > 0
