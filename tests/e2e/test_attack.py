"""Attacks and local DP end to end: `fedprompt simulate` with a malicious, boosting client and Laplace LDP.

Real coordinator and worker processes, real MiniLM, SST-2; tiny sizes (the numbers mean nothing, the
plumbing does): ASR reaches the round history and results.json, the malicious client's local ASR and
every client's cumulative epsilon are recorded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fedprompt.coordinator.persistence.db import make_engine, make_sessionmaker
from fedprompt.coordinator.service import Coordinator

from tests.helpers import simulate_in_process

pytestmark = pytest.mark.slow
FEDPROMPT = str(Path(sys.executable).parent / "fedprompt")


def test_malicious_client_with_ldp_reports_asr_local_asr_and_epsilon(tmp_path: Path) -> None:
    out = tmp_path / "attack"
    cmd = [
        FEDPROMPT,
        "simulate",
        "--dataset",
        "sst2",
        "--clients",
        "3",
        "--fraction",
        "1.0",
        "--rounds",
        "2",
        "--local-steps",
        "2",
        "--batch-size",
        "8",
        "--max-length",
        "48",
        "--train-limit",
        "90",
        "--eval-limit",
        "60",
        "--parallel",
        "2",
        "--malicious",
        "1",
        "--target-label",
        "1",
        "--attack",
        "boost:3",
        "--ldp-epsilon",
        "1000",
        "--ldp-clip",
        "50",
        "--aggregation",
        "trimmed_mean:beta=0.34",
        "--save-prompt",
        str(out / "final.safetensors"),
        "--out",
        str(out),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "attack success rate:" in done.stdout

    results = json.loads((out / "results.json").read_text())
    assert results["spec"]["aggregation"] == {"name": "trimmed_mean", "params": {"beta": 0.34}}
    assert results["spec"]["privacy"] == {
        "mechanism": "laplace",
        "epsilon": 1000.0,
        "delta": None,
        "clip": 50.0,
    }
    assert results["backdoor"]["malicious"] == 1 and results["backdoor"]["attack"] == "boost:3"
    assert 0.0 <= results["initial_asr"] <= 1.0
    engine = make_engine(f"sqlite:///{out / 'fedprompt.db'}")
    try:
        service = Coordinator(make_sessionmaker(engine))
        fid = results["federation_id"]
        history = [r for r in service.reads.rounds(fid) if r["state"] == "closed"]
        status = service.reads.federation_status(fid)
        clients = {c["name"]: c["id"] for c in service.reads.list_clients(fid)}
    finally:
        engine.dispose()
    for number, (rec, rnd) in enumerate(zip(results["rounds"], history, strict=True), 1):
        # every client evaluated: 60 test examples, ASR only over those whose label is not the target
        assert rnd["evaluation"]["num_samples"] == 60
        assert 0 < rnd["evaluation"]["asr_samples"] < 60
        assert rec["asr"] == pytest.approx(rnd["evaluation"]["asr"])
        # only client-0 is malicious: it alone reports a local ASR
        assert list(rnd["stats"]["local_asr"]) == [str(clients["client-0"])]
        assert rec["local_asr"] == pytest.approx(rnd["stats"]["local_asr"][str(clients["client-0"])])
        privacy = rnd["stats"]["privacy"]
        assert privacy["epsilon"] == 1000.0
        assert set(privacy["cumulative_epsilon"].values()) == {1000.0 * number}  # basic composition
        assert rec["epsilon_cumulative"] == 1000.0 * number
    assert status["privacy"]["max_cumulative_epsilon"] == 2000.0
    assert len(status["privacy"]["cumulative_epsilon"]) == 3
    assert (out / "asr.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "final.safetensors").stat().st_size > 30_000


def test_bad_attack_options_are_refused_before_any_process_starts(tmp_path: Path) -> None:
    for bad, message in [
        (["--attack", "boost:-2"], "FACTOR must be positive"),
        (["--malicious", "5", "--clients", "3"], "--malicious must be between 0 and --clients"),
        (["--ldp-epsilon", "1"], "--ldp-epsilon and --ldp-clip go together"),
        (["--ldp-epsilon", "1", "--ldp-clip", "5", "--ldp-mechanism", "gaussian"], "needs delta"),
        (["--ldp-delta", "1e-5"], "need --ldp-epsilon and --ldp-clip"),
        (["--aggregation", "trimmed_mean:gamma=1"], "has no parameter(s) ['gamma']"),
    ]:
        done = simulate_in_process("--out", str(tmp_path / "x"), *bad)
        assert done.exit_code == 2, done.output
        assert message in " ".join(done.output.split()), done.output
        assert not (tmp_path / "x" / "fedprompt.db").exists()
