"""fedprompt beside Flower on the same federation: wall time, peak memory, accuracy per round.

    make bench-peers            # builds .venv-peers (flwr[simulation]) and runs the default below
    python -m bench.peers [--clients 100 --fraction 0.1 --rounds 5 --local-steps 20 --repeats 3]

Each repeat (seed 0, 1, 2, …) runs `fedprompt simulate` (coordinator and worker pools over HTTP on
loopback, SQLite) and then the same federation under Flower's simulation engine (`bench/peers_flower.py`
in `.venv-peers`: a ServerApp and a ClientApp on Ray actors), one after the other, so the two share
the machine's state. The Flower run reproduces the fedprompt run of its repeat: the same spec, starting
prompt, shards, selected clients, per-client seeds and evaluation, so the accuracies should agree to
within float rounding, which the result file checks per round.

Measured per run, by this process: the command's wall time (start-up included), the federation's own
seconds (as each reports it), and the peak memory of the whole process tree — every process the
command started, Ray's too — summed as proportional set size (PSS: shared pages counted once over the
processes that share them), sampled every `--sample` seconds. Each round's overhead beyond training is
(the federation's seconds − the selected clients' training seconds ÷ the training slots) ÷ rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from bench.common import ROOT, ratio, spread, write_result

PEERS_PYTHON = ROOT / ".venv-peers" / "bin" / "python"


class TreeMemory(threading.Thread):
    """Samples the summed PSS and RSS of a process and all its descendants until stopped."""

    def __init__(self, pid: int, every: float) -> None:
        super().__init__(daemon=True)
        self.pid, self.every = pid, every
        self.peak_pss = self.peak_rss = 0
        self.names: dict[str, int] = {}  # process name -> its largest PSS seen
        self._done = threading.Event()

    def sample(self) -> None:
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        pss = rss = 0
        for proc in procs:
            try:
                info = proc.memory_full_info()
                name = proc.name()
            except psutil.Error:
                continue  # exited meanwhile
            pss += info.pss
            rss += info.rss
            self.names[name] = max(self.names.get(name, 0), info.pss)
        self.peak_pss, self.peak_rss = max(self.peak_pss, pss), max(self.peak_rss, rss)

    def run(self) -> None:
        while not self._done.wait(self.every):
            self.sample()

    def stop(self) -> None:
        self._done.set()
        self.join()


def measured(argv: list[str], log: Path, env: dict[str, str], every: float) -> dict[str, Any]:
    """Run a command, its wall time and its process tree's peak memory."""
    with log.open("wb") as out:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        memory = TreeMemory(proc.pid, every)
        memory.start()
        code = proc.wait()
        wall = time.perf_counter() - started
        memory.stop()
    if code != 0:
        raise SystemExit(f"{argv[0]} exited {code}; see {log}")
    return {
        "wall_s": wall,
        "peak_pss_mib": memory.peak_pss / 2**20,
        "peak_rss_sum_mib": memory.peak_rss / 2**20,
        "processes": {n: round(v / 2**20, 1) for n, v in sorted(memory.names.items(), key=lambda kv: -kv[1])},
    }


def fedprompt_rounds(run: Path) -> list[dict[str, Any]]:
    """Per round of a fedprompt run: its seconds, accuracy, and each update's training seconds."""
    results = json.loads((run / "results.json").read_text())
    con = sqlite3.connect(next(run.glob("*.db")))
    try:
        rows = con.execute(
            "select r.number, u.client_id, u.metrics from updates u join rounds r on r.id = u.round_id "
            "where r.state = 'closed' order by r.number, u.client_id"
        ).fetchall()
    finally:
        con.close()
    train: dict[int, list[float]] = {}
    clients: dict[int, list[int]] = {}
    for number, client, metrics in rows:
        train.setdefault(number, []).append(float(json.loads(metrics)["seconds"]))
        clients.setdefault(number, []).append(int(client))
    return [
        {
            "round": r["round"],
            "clients": clients.get(r["round"], []),
            "seconds": r["seconds"],
            "train_s": train.get(r["round"], []),
            "accuracy": r["accuracy"],
        }
        for r in results["rounds"]
        if r["round"] > 0
    ]


def overhead_per_round(federation_s: float, rounds: list[dict[str, Any]], slots: int) -> float:
    """(federation seconds − training seconds ÷ slots) ÷ rounds."""
    training = sum(sum(r["train_s"]) for r in rounds) / slots
    return (federation_s - training) / max(1, len(rounds))


def one_repeat(args: argparse.Namespace, seed: int, folder: Path, env: dict[str, str]) -> dict[str, Any]:
    """fedprompt then Flower on the same federation (seed `seed`)."""
    run = folder / f"fedprompt-seed{seed}"
    simulate = [
        str(Path(sys.executable).with_name("fedprompt")),
        "simulate",
        "--dataset", args.dataset,
        "--clients", str(args.clients),
        "--fraction", str(args.fraction),
        "--rounds", str(args.rounds),
        "--local-steps", str(args.local_steps),
        "--batch-size", str(args.batch_size),
        "--evaluators", "1",
        "--drift-correction", "none",  # FedAvg's plain local steps, as the Flower ClientApp's
        "--seed", str(seed),
        "--parallel", str(args.slots),
        "--out", str(run),
        "--force",
    ]  # fmt: skip
    if args.train_limit:
        simulate += ["--train-limit", str(args.train_limit)]
    if args.eval_limit:
        simulate += ["--eval-limit", str(args.eval_limit)]
    fp = measured(simulate, folder / f"fedprompt-seed{seed}.log", env, args.sample)
    results = json.loads((run / "results.json").read_text())
    fp_rounds = fedprompt_rounds(run)
    fp.update(
        federation_s=float(results["wall_seconds"]),
        initial_accuracy=results["initial_accuracy"],
        final_accuracy=results["final_accuracy"],
        rounds=fp_rounds,
        overhead_per_round_s=overhead_per_round(float(results["wall_seconds"]), fp_rounds, args.slots),
    )
    flower_json = folder / f"flower-seed{seed}.json"
    flower_cmd = [
        str(args.peers_python),
        "-m",
        "bench.peers_flower",
        "--run",
        str(run),
        "--out",
        str(flower_json),
    ]
    fl = measured(
        flower_cmd + ["--cpus", str(args.slots)], folder / f"flower-seed{seed}.log", env, args.sample
    )
    done = json.loads(flower_json.read_text())
    fl.update(
        federation_s=done["federation_seconds"],
        initial_accuracy=done["initial_accuracy"],
        final_accuracy=done["final_accuracy"],
        rounds=done["rounds"],
        overhead_per_round_s=overhead_per_round(done["federation_seconds"], done["rounds"], args.slots),
    )
    same_clients = [a["clients"] for a in fp_rounds] == [b["clients"] for b in done["rounds"]]
    accuracy_gap = max(
        [abs(fp["initial_accuracy"] - fl["initial_accuracy"])]
        + [abs(a["accuracy"] - b["accuracy"]) for a, b in zip(fp_rounds, done["rounds"], strict=True)]
    )
    return {
        "seed": seed,
        "fedprompt": fp,
        "flower": fl,
        "same_clients": same_clients,
        "max_accuracy_gap_points": 100 * accuracy_gap,
    }


def summary(repeats: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians and spreads of each figure, and fedprompt ÷ Flower per repeat."""
    out: dict[str, Any] = {}
    for key in (
        "wall_s",
        "federation_s",
        "peak_pss_mib",
        "peak_rss_sum_mib",
        "overhead_per_round_s",
        "final_accuracy",
    ):
        out[key] = {
            "fedprompt": spread([r["fedprompt"][key] for r in repeats]),
            "flower": spread([r["flower"][key] for r in repeats]),
            "ratio": spread([ratio(r["fedprompt"][key], r["flower"][key]) for r in repeats]),
        }
    out["max_accuracy_gap_points"] = max(r["max_accuracy_gap_points"] for r in repeats)
    out["same_clients"] = all(r["same_clients"] for r in repeats)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="sst2")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--local-steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--train-limit", type=int, default=8000)
    parser.add_argument("--eval-limit", type=int, default=872)
    parser.add_argument("--repeats", type=int, default=3, help="seeds 0 … repeats − 1, one repeat each")
    parser.add_argument("--slots", type=int, default=os.cpu_count() or 1, help="clients training at once")
    parser.add_argument("--sample", type=float, default=0.5, help="seconds between memory samples")
    parser.add_argument("--peers-python", type=Path, default=PEERS_PYTHON)
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "peers")
    parser.add_argument("--name", default="peers", help="result file bench/results/NAME.json")
    args = parser.parse_args(argv)
    if not args.peers_python.exists():
        raise SystemExit(f"{args.peers_python} is missing: `make bench-peers` builds Flower's environment")
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    args.work.mkdir(parents=True, exist_ok=True)
    repeats = []
    for seed in range(args.repeats):
        repeats.append(one_repeat(args, seed, args.work, env))
        print(json.dumps({k: repeats[-1][k] for k in ("seed", "same_clients", "max_accuracy_gap_points")}))
    flower_version = subprocess.run(
        [str(args.peers_python), "-c", "import flwr, ray; print(flwr.__version__, ray.__version__)"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    path = write_result(
        args.name,
        {
            "settings": {k: v for k, v in vars(args).items() if k not in ("peers_python", "work")},
            "flwr": flower_version[0],
            "ray": flower_version[1],
            "summary": summary(repeats),
            "repeats": repeats,
        },
    )
    print(path)


if __name__ == "__main__":
    main()
