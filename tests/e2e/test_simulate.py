"""`fedprompt simulate` end to end: real coordinator and worker processes, real MiniLM, SST-2."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fedprompt.coordinator.persistence.db import make_engine, make_sessionmaker
from fedprompt.coordinator.service import Coordinator
from fedprompt.shared.local import free_port

from tests.helpers import processes_mentioning, simulate_in_process, wait_for

pytestmark = pytest.mark.slow
FEDPROMPT = str(Path(sys.executable).parent / "fedprompt")


def _cmd(out: Path, rounds: int, local_steps: int) -> list[str]:
    return [
        FEDPROMPT,
        "simulate",
        "--dataset",
        "sst2",
        "--clients",
        "3",
        "--fraction",
        "0.6",
        "--rounds",
        str(rounds),
        "--local-steps",
        str(local_steps),
        "--batch-size",
        "4",
        "--max-length",
        "32",
        "--train-limit",
        "300",
        "--eval-limit",
        "60",
        "--parallel",
        "2",
        "--out",
        str(out),
    ]


def _history(out: Path) -> list[dict]:
    engine = make_engine(f"sqlite:///{out / 'fedprompt.db'}")
    try:
        service = Coordinator(make_sessionmaker(engine))
        fid = json.loads((out / "simulation.json").read_text())["federation_id"]
        return service.reads.rounds(fid)
    finally:
        engine.dispose()


def test_simulate_with_pools_agrees_with_the_coordinator_and_restarts_a_killed_pool(tmp_path: Path) -> None:
    """One federation for several properties (each simulate run costs ~30 CPU-seconds of start-up):
    results.json, rounds.csv, the plot and MLflow agree with the coordinator's database; five clients
    run in two pool processes, one of which is killed mid-federation and restarted without a client
    re-enrolling; with --evaluators 2 only the first two clients evaluate, on the whole test split."""
    out = tmp_path / "run"
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    port = free_port()
    cmd = _cmd(out, rounds=2, local_steps=20)
    cmd[cmd.index("--clients") + 1] = "5"
    cmd += [
        "--processes",
        "2",
        "--evaluators",
        "2",
        "--track",
        f"mlflow:{store}",
        "--dashboard-port",
        str(port),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    try:
        wait_for(
            lambda: (out / "simulation.json").exists() and (out / "fedprompt.db").exists(), 600, "federation"
        )
        wait_for(
            lambda: any(r["state"] == "open" for r in _history(out)), 600, "round 1 to open", interval=0.5
        )
        # two processes for five clients (under load the second may still be starting when round 1 opens)
        wait_for(
            lambda: len(processes_mentioning(str(out / "pools"))) == 2,
            120,
            "two pool processes",
            interval=0.5,
        )
        pools = processes_mentioning(str(out / "pools"))
        assert len(pools) == 2
        victim = next(pid for pid, cmdline in pools if "pool-0.json" in cmdline)
        # one thread per client: the pool runs with glibc's arenas capped, so its memory does not
        # grow with the number of distinct clients it has trained
        environ = Path(f"/proc/{victim}/environ").read_bytes().split(b"\0")
        assert b"MALLOC_ARENA_MAX=2" in environ
        os.kill(victim, signal.SIGKILL)
        output, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output
    said = " ".join(output.split())
    assert "worker pool 0 exited with code -9; restarting it" in said
    # where to watch it, on the port asked for, and where the admin token is
    assert f"dashboard http://127.0.0.1:{port}/dashboard" in said
    assert f"admin token in {out / 'admin-token'}" in said
    assert "results:" in said
    assert processes_mentioning(str(out)) == []

    results = json.loads((out / "results.json").read_text())
    assert {"spec", "rounds", "final_accuracy", "total_bytes_up", "total_bytes_down", "wall_seconds"} <= set(
        results
    )
    history = [r for r in _history(out) if r["state"] == "closed"]
    assert [r["round"] for r in results["rounds"]] == [r["round"] for r in history] == [1, 2]
    for rec, rnd in zip(results["rounds"], history, strict=True):
        # every selected client's update arrived once, from its own identity: ceil(0.6 * 5)
        uploaded = [p["client_id"] for p in rnd["participants"] if p["uploaded"]]
        assert len(uploaded) == len(set(uploaded)) == rnd["stats"]["updates"] == 3
        assert rec["participants"] == len(rnd["participants"]) == 3
        assert rec["bytes_up"] == rnd["stats"]["bytes_up"] > 0
        assert rec["bytes_down"] == rnd["stats"]["bytes_down"] > 0
        assert rec["accuracy"] == pytest.approx(rnd["evaluation"]["accuracy"])
        assert (rnd["evaluation"]["clients"], rnd["evaluation"]["num_samples"]) == (2, 60)
        assert rec["loss"] == pytest.approx(rnd["stats"]["train_loss"])
    assert results["final_accuracy"] == results["rounds"][-1]["accuracy"]
    # memory at each round's close, and the peak until then, so growth over rounds shows
    peaks = [rec["peak_rss_bytes"] for rec in results["rounds"]]
    assert all(0 < rec["rss_bytes"] <= rec["peak_rss_bytes"] for rec in results["rounds"])
    assert peaks == sorted(peaks) and peaks[-1] <= results["peak_rss_bytes"]
    assert results["total_bytes_up"] == sum(r["stats"]["bytes_up"] for r in history)
    with open(out / "rounds.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["round"]) for r in rows] == [0, 1, 2]  # round 0: the starting prompt
    assert float(rows[0]["accuracy"]) == pytest.approx(results["initial_accuracy"])
    assert [float(r["accuracy"]) for r in rows[1:]] == pytest.approx(
        [r["accuracy"] for r in results["rounds"]]
    )
    png = (out / "accuracy.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    # clients enrol in worker order, so a round's seeded selection picks the same data shards every
    # run; the killed pool's clients came back with their credentials, not as new clients
    creds = [json.loads((out / "workers" / str(i) / "credentials.json").read_text()) for i in range(5)]
    ids = [c["client_id"] for c in creds]
    assert ids == sorted(ids) and len(set(ids)) == 5
    engine = make_engine(f"sqlite:///{out / 'fedprompt.db'}")
    try:
        fid = json.loads((out / "simulation.json").read_text())["federation_id"]
        clients = Coordinator(make_sessionmaker(engine)).reads.list_clients(fid)
    finally:
        engine.dispose()
    assert sorted(c["name"] for c in clients) == [f"client-{i}" for i in range(5)]
    # each evaluating site's own accuracy per round, beside the global one
    assert [sorted(site["name"] for site in rec["sites"]) for rec in results["rounds"]] == [
        ["client-0", "client-1"]
    ] * 2
    assert all(
        rec["site_min_accuracy"] <= rec["accuracy"] <= rec["site_max_accuracy"] for rec in results["rounds"]
    )

    # the run, read back with MLflow's own client: params, metrics per round, the adapter
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("fedprompt").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["spec.rounds"] == "2"
    assert run.data.params["dataset"] == "sst2" and run.data.params["clients"] == "5"
    history_acc = client.get_metric_history(run.info.run_id, "accuracy")
    logged = sorted((m.step, m.value) for m in history_acc)
    assert [step for step, _ in logged] == [0, 1, 2]
    assert [value for _, value in logged] == pytest.approx(
        [results["initial_accuracy"]] + [r["accuracy"] for r in results["rounds"]]
    )
    assert run.data.metrics["best_accuracy"] == pytest.approx(results["best_accuracy"])
    assert sum(1 for key in run.data.metrics if key.startswith("site.client-")) == 2
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"results.json", "rounds.csv", "accuracy.png", "adapter"} <= artifacts
    adapter = {a.path for a in client.list_artifacts(run.info.run_id, "adapter")}
    assert {"adapter/adapter_config.json", "adapter/adapter_model.safetensors"} <= adapter


def test_sigint_mid_round_leaves_no_process_and_rerun_continues(tmp_path: Path) -> None:
    out = tmp_path / "resume"
    rounds = 4  # rounds of seconds: the interrupt lands inside round 2 or 3, with a round to spare
    cmd = _cmd(out, rounds=rounds, local_steps=10)
    # Ctrl-C's default action even when the test runner was started with SIGINT ignored (a
    # background job): Python only installs its KeyboardInterrupt handler over SIG_DFL.
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        wait_for(
            lambda: (out / "fedprompt.db").exists() and (out / "simulation.json").exists(),
            600,
            "the federation",
        )

        def mid_federation() -> bool:
            history = _history(out)
            if history and history[-1]["round"] == rounds:  # this test starved for whole rounds
                raise AssertionError("the last round opened before the interrupt could land mid-federation")
            return any(r["state"] == "closed" for r in history) and history[-1]["state"] == "open"

        wait_for(mid_federation, 600, "round 1 to close and the next to open", interval=0.5)
        assert len(processes_mentioning(str(out))) >= 3  # simulate and the 2 worker pools (2 cores)
        before = {r["round"]: r for r in _history(out) if r["state"] == "closed"}
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, proc.stdout.read() if proc.stdout else ""
    time.sleep(0.5)
    assert processes_mentioning(str(out)) == []
    partial = json.loads((out / "results.json").read_text())  # what was measured, labelled partial
    assert partial["status"] == "partial" and set(before) <= {r["round"] for r in partial["rounds"]}

    again = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "continuing federation" in again.stdout
    history = _history(out)
    closed = [r for r in history if r["state"] == "closed"]
    assert [r["round"] for r in closed] == list(range(1, rounds + 1))
    for number, old in before.items():  # closed rounds were kept, not redone
        kept = next(r for r in closed if r["round"] == number)
        assert kept["closed_at"] == old["closed_at"] and kept["attempt"] == old["attempt"]
    results = json.loads((out / "results.json").read_text())
    assert [r["round"] for r in results["rounds"]] == list(range(1, rounds + 1))
    assert processes_mentioning(str(out)) == []


@pytest.mark.parametrize(
    "option, message",
    [
        (["--partition", "foo"], "unknown partition scheme"),
        (["--fraction", "1.5"], "--fraction must be in (0, 1]"),
        (["--evaluators", "9"], "--evaluators must be in 1..4 (--clients); got 9"),
        (["--verbalizer", "nope"], "--verbalizer 'nope': give words for at least two labels"),
        (["--dataset", "no-such-set"], "no data set named 'no-such-set'"),
        (["--track", "wandb"], "the tracker is one of mlflow, tensorboard"),
    ],
)
def test_bad_options_fail_before_any_process_starts(tmp_path: Path, option: list[str], message: str) -> None:
    out = tmp_path / "bad"
    done = simulate_in_process(*option, "--out", str(out))
    assert done.exit_code == 2, done.output
    assert message in " ".join(done.output.split())
    assert not out.exists()
