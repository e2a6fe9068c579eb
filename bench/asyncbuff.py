"""Mode async (FedBuff) against rounds when clients differ in speed: time to a stated accuracy and
accuracy at a wall-clock budget, on one machine, interleaved.

    python -m bench.asyncbuff [--seeds 0,1,2 --target 75]

Each seed runs `fedprompt simulate` twice on SST-2 with the same K clients, shards, starting prompt,
per-update local steps and client slowdowns (`--client-speed linear:max=10`: client i of K holds each
update for (f_i − 1) times its training time, f_i from 1 to 10): once in rounds (FedAvg, C·K clients
a round, each round waiting for its slowest) and once in mode async (at most C·K clients training,
a version every B updates, staleness-weighted). Both see the same number of updates in all, so the
same training work; the order of the two alternates from seed to seed. Each version's accuracy is
the whole (limited) test split's, by the same evaluator clients in both; its time is `elapsed_s`,
from the first round's (buffer's) opening to the version's. Reported per seed: the time each mode
takes to reach the target accuracy, and each mode's accuracy at the budget (the wall-clock time the
faster mode needed for all its versions), with async ÷ rounds as ratios; and the accuracy-versus-time
curves of both in one plot (bench/results/async-sst2.png).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import RESULTS, ROOT, ratio, spread, write_result

FEDPROMPT = str(Path(sys.executable).parent / "fedprompt")
VERBALIZER = "terrible,awful,bad;great,wonderful,good"


def simulate(out: Path, mode: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """One `fedprompt simulate` run; its versions' (elapsed_s, accuracy) and what its buffers held."""
    per_round = max(1, round(args.fraction * args.clients))
    common = [
        FEDPROMPT, "simulate", "--dataset", args.dataset, "--clients", str(args.clients),
        "--local-steps", str(args.local_steps), "--batch-size", "16", "--lr", "0.01",
        "--verbalizer", VERBALIZER, "--train-limit", str(args.train_limit), "--eval-limit", str(args.eval_limit),
        "--evaluators", str(args.evaluators), "--client-speed", args.client_speed, "--seed", str(seed),
        "--processes", "2", "--out", str(out), "--force",
    ]  # fmt: skip
    if mode == "sync":
        extra = ["--fraction", str(args.fraction), "--rounds", str(args.rounds)]
    else:
        versions = args.rounds * per_round // args.buffer_size  # the same updates in all
        extra = ["--mode", "async", "--concurrency", str(per_round), "--buffer-size", str(args.buffer_size)]
        extra += ["--rounds", str(versions)]
    started = time.perf_counter()
    done = subprocess.run([*common, *extra], capture_output=True, text=True, env={**os.environ}, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(
            f"simulate ({mode}, seed {seed}) failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    results = json.loads((out / "results.json").read_text())
    curve = [(0.0, results["initial_accuracy"])] + [
        (r["elapsed_s"], r["accuracy"]) for r in results["rounds"] if r["accuracy"] is not None
    ]
    with sqlite3.connect(out / "fedprompt.db") as db:
        stats = [json.loads(s) for (s,) in db.execute("SELECT stats FROM rounds WHERE state = 'closed'")]
    taus = [
        int(t)
        for st in stats
        for t, n in (st.get("buffer") or {}).get("staleness", {}).items()
        for _ in range(n)
    ]
    return {
        "mode": mode,
        "seed": seed,
        "wall_s": wall,
        "federation_s": results["rounds"][-1]["elapsed_s"],
        "versions": len(results["rounds"]),
        "updates": sum(r["participants"] for r in results["rounds"]),
        "curve": curve,
        "initial_accuracy": results["initial_accuracy"],
        "final_accuracy": results["final_accuracy"],
        "mean_staleness": sum(taus) / len(taus) if taus else None,
        "slowdowns": results.get("slowdowns"),
        "spec": {
            k: results["spec"].get(k) for k in ("mode", "fraction", "concurrency", "buffer_size", "rounds")
        },
    }


def time_to(curve: list[tuple[float, float]], target: float) -> float | None:
    """The first version's time whose accuracy reaches the target (None: never)."""
    return next((t for t, acc in curve if acc >= target), None)


def accuracy_at(curve: list[tuple[float, float]], budget: float) -> float:
    """The accuracy of the last version written by the budget (the starting prompt's if none)."""
    return [acc for t, acc in curve if t <= budget + 1e-9][-1]


def plot(runs: list[dict[str, Any]], target: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    colours = {"sync": "tab:blue", "async": "tab:orange"}
    for run in runs:
        t, acc = zip(*run["curve"], strict=True)
        label = (
            ("rounds (FedAvg)" if run["mode"] == "sync" else "mode async (FedBuff)")
            if run["seed"] == 0
            else None
        )
        ax.plot(
            t, [100 * a for a in acc], marker="o", ms=3, color=colours[run["mode"]], alpha=0.8, label=label
        )
    ax.axhline(100 * target, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("wall-clock seconds from the first round's opening")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("SST-2, clients 1-10x slow: every seed (one line per seed and mode)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", default="sst2")
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--fraction", type=float, default=0.5, help="Rounds: C. Mode async: concurrency = C·K.")
    p.add_argument(
        "--rounds", type=int, default=3, help="Rounds (mode async: the versions of as many updates)."
    )
    p.add_argument("--buffer-size", type=int, default=5)
    p.add_argument("--local-steps", type=int, default=30)
    p.add_argument("--train-limit", type=int, default=4000)
    p.add_argument("--eval-limit", type=int, default=400)
    p.add_argument("--evaluators", type=int, default=2)
    p.add_argument("--client-speed", default="linear:max=10")
    p.add_argument("--target", type=float, default=75.0, help="Accuracy to reach, in %%.")
    p.add_argument(
        "--ladder",
        default="70,72,74",
        help="Further accuracies, in %%, whose times are reported beside the target's.",
    )
    p.add_argument(
        "--from-json",
        type=Path,
        default=None,
        help="Recompute the figures from this result file's runs (no runs).",
    )
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "bench-async")
    args = p.parse_args(argv)
    target = args.target / 100
    targets = sorted({target, *(float(x) / 100 for x in args.ladder.split(",") if x.strip())})
    runs: list[dict[str, Any]] = []
    measured: dict[str, Any] = {}
    if args.from_json is not None:  # the runs of an earlier result file, their figures computed again
        kept = json.loads(args.from_json.read_text())
        runs = kept["runs"]
        measured = {"runs_from": {k: kept.get(k) for k in ("command", "finished_at", "machine")}}
        args = argparse.Namespace(**{**kept["settings"], "target": args.target, "ladder": args.ladder})
    else:
        for i, seed in enumerate(int(s) for s in args.seeds.split(",")):
            for mode in ("sync", "async") if i % 2 == 0 else ("async", "sync"):
                run = simulate(args.work / f"{mode}-seed{seed}", mode, seed, args)
                print(
                    f"seed {seed} {mode}: {run['federation_s']:.0f} s, final {100 * run['final_accuracy']:.1f} %",
                    flush=True,
                )
                runs.append(run)
    pairs = []
    for seed in sorted({r["seed"] for r in runs}):
        sync = next(r for r in runs if r["seed"] == seed and r["mode"] == "sync")
        asy = next(r for r in runs if r["seed"] == seed and r["mode"] == "async")
        budget = min(sync["federation_s"], asy["federation_s"])
        t_sync, t_async = time_to(sync["curve"], target), time_to(asy["curve"], target)
        pairs.append(
            {
                "seed": seed,
                "time_to_target_sync_s": t_sync,
                "time_to_target_async_s": t_async,
                "time_to_target_ratio": ratio(t_async, t_sync),
                "budget_s": budget,
                "accuracy_at_budget_sync": accuracy_at(sync["curve"], budget),
                "accuracy_at_budget_async": accuracy_at(asy["curve"], budget),
                "federation_ratio": ratio(asy["federation_s"], sync["federation_s"]),
                "ladder": [
                    {
                        "target": x,
                        "sync_s": time_to(sync["curve"], x),
                        "async_s": time_to(asy["curve"], x),
                        "ratio": ratio(time_to(asy["curve"], x), time_to(sync["curve"], x)),
                    }
                    for x in targets
                ],
            }
        )
    png = RESULTS / "async-sst2.png"
    plot(runs, target, png)
    summary = {
        key: spread([p[key] for p in pairs])
        for key in (
            "time_to_target_ratio",
            "federation_ratio",
            "accuracy_at_budget_sync",
            "accuracy_at_budget_async",
        )
    }
    path = write_result(
        "async",
        {
            "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "target_accuracy": target,
            "targets": targets,
            "runs": runs,
            "pairs": pairs,
            "summary": summary,
            "plot": str(png.relative_to(ROOT)),
            **measured,
        },
    )
    print(f"wrote {path} and {png}")


if __name__ == "__main__":
    main()
