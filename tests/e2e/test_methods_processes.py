"""Prefix tuning and P-tuning federations through real processes (`fedprompt simulate`, MiniLM, SST-2).

Small on purpose (2 clients, 2 rounds, a few local steps on a 64-sentence slice): what is shown is that
every round closes with the method's tensors and that the result exports as a PEFT adapter the real
model loads, not an accuracy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fedprompt.coordinator.persistence.db import make_engine, make_sessionmaker
from fedprompt.coordinator.service import Coordinator
from fedprompt.shared import wire
from fedprompt.shared.spec import FederationSpec

from tests.helpers import ADMIN, coordinator_process, processes_mentioning

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent


def _simulate(out: Path, method: list[str], lr: str) -> dict:
    cmd = [
        str(BIN / "fedprompt"), "simulate", "--dataset", "sst2", "--clients", "2", "--fraction", "1.0",
        "--rounds", "2", "--local-steps", "3", "--batch-size", "8", "--max-length", "32",
        "--num-virtual-tokens", "5", "--lr", lr, "--train-limit", "64", "--eval-limit", "32",
        "--parallel", "2", "--out", str(out), *method,
    ]  # fmt: skip
    env = {**os.environ, "COLUMNS": "200"}  # one line per round, as on a wide terminal
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((out / "results.json").read_text())
    # The per-round line carries the ledger: parameters per client and their share of the model.
    sent, ratio = results["params_communicated"], results["comm_ratio"]
    lines = [ln for ln in done.stdout.splitlines() if f"{sent:,} ({100 * ratio:.4f} %)" in ln]
    assert len(lines) == 2, done.stdout
    return results


def _closed_rounds(out: Path, fid: int) -> list[dict]:
    engine = make_engine(f"sqlite:///{out / 'fedprompt.db'}")
    try:
        return [r for r in Coordinator(make_sessionmaker(engine)).reads.rounds(fid) if r["state"] == "closed"]
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    ("method", "lr", "names"),
    [
        (["--method", "prefix_tuning"], "0.05", ["prompt_embeddings"]),
        (["--method", "p_tuning", "--encoder-type", "mlp", "--encoder-hidden-size", "32"], "0.01", None),
    ],
    ids=["prefix_tuning", "p_tuning"],
)
def test_federation_with_method_closes_every_round(
    tmp_path: Path, method: list[str], lr: str, names: list[str] | None
) -> None:
    """Two rounds close with both clients; results.json has the ledger; the export loads into MiniLM."""
    out = tmp_path / "run"
    results = _simulate(out, method, lr)
    spec = FederationSpec.model_validate(results["spec"])
    assert spec.method == method[1] and spec.num_layers == 6 and spec.family == "masked_lm"
    assert spec.model_fingerprint and spec.model_info and spec.model_info["hidden_size"] == 384

    # Every round closed with both clients' updates of exactly the method's tensors.
    fid = results["federation_id"]
    history = _closed_rounds(out, fid)
    assert [r["round"] for r in history] == [1, 2]
    assert all(r["stats"]["updates"] == r["stats"]["participants"] == 2 for r in history)
    assert [r["round"] for r in results["rounds"]] == [1, 2]

    # The ledger: per client and direction, the method's parameter count against the whole of MiniLM.
    sent = spec.params_communicated()
    assert results["params_communicated"] == sent
    assert results["params_full_model"] == 22_713_216
    assert results["comm_ratio"] == pytest.approx(sent / 22_713_216)
    for rec in results["rounds"]:
        assert rec["params_up"] == rec["params_down"] == 2 * sent
        assert rec["bytes_up"] > 2 * 4 * sent

    # The final global prompt has the method's tensors, and a coordinator on the same database exports it
    # through `fedprompt export`; PEFT loads the folder onto the real MiniLM.
    with coordinator_process(f"sqlite:///{out / 'fedprompt.db'}", tmp_path) as (url, _):
        env = {**os.environ, "FEDPROMPT_URL": url, "FEDPROMPT_ADMIN_TOKEN": ADMIN}
        got = subprocess.run(
            [str(BIN / "fedprompt"), "prompt", "get", "-f", str(fid), "--out", str(tmp_path / "p.st")],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert got.returncode == 0, got.stderr
        exported = subprocess.run(
            [str(BIN / "fedprompt"), "export", "--federation", str(fid), "--version", "latest",
             "--format", "peft", "--out", str(tmp_path / "adapter")],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert exported.returncode == 0, exported.stderr
    tensors, _ = wire.decode_checked((tmp_path / "p.st").read_bytes(), spec.tensor_shapes())
    assert names is None or sorted(tensors) == names
    _load_into_minilm(tmp_path / "adapter", spec)
    assert processes_mentioning(str(out)) == []


def _load_into_minilm(folder: Path, spec: FederationSpec) -> None:
    import torch
    from fedprompt.worker.engine import resolve_model
    from peft import PeftModel
    from transformers import AutoModel, AutoTokenizer

    path = resolve_model(spec.model)
    base = AutoModel.from_pretrained(path).eval()
    model = PeftModel.from_pretrained(base, str(folder)).eval()
    batch = AutoTokenizer.from_pretrained(path)(["a gorgeous film . it was [MASK] ."], return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    width = batch["input_ids"].shape[1] + (0 if spec.method == "prefix_tuning" else spec.num_virtual_tokens)
    assert hidden.shape == (1, width, 384) and bool(torch.isfinite(hidden).all())
