"""End to end: `fedprompt simulate` on 10 clients, its wall time split into training, communication,
serialisation, evaluation, aggregation and idle.

    python -m bench.e2e [--clients 10 --rounds 2 --local-steps 5 --train-limit 2000 --repeats 3]

The split comes from what the federation itself records: the coordinator's round history (opened,
closed, ``stats.aggregation_s``), each stored update (its arrival time, the worker's training seconds
and the ``timing`` metadata the worker stamps: task received, download seconds, wait for a training
slot, training finished) and each evaluation's arrival. For every participant of a round:

    round wall = evaluation of the previous version + long-poll delivery + download + slot wait
                 + training + (prompt load, release, serialisation) + upload
                 + wait for the other participants + aggregation

All processes share one clock (loopback). The shares are averaged over participants and rounds, as
shares of the round's own wall time. The baseline, in the same repeat (the order alternating): the same
number of training steps (clients × rounds × local steps) in ``fedprompt-worker train-local``, so
the federation's overhead is a ratio (whole run ÷ whole run; time inside rounds ÷ training time).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fedprompt.shared import wire

from bench.common import ratio, spread, write_result

PARTS = (
    "evaluation",
    "poll",
    "download",
    "slot_wait",
    "training",
    "serialisation",
    "upload",
    "others",
    "aggregation",
)
GROUPS = {
    "training": ("training",),
    "communication": ("poll", "download", "upload"),
    "serialisation": ("serialisation",),
    "evaluation": ("evaluation",),
    "aggregation": ("aggregation",),
    "idle": ("slot_wait", "others"),
}


def split_rounds(db_path: Path) -> list[dict[str, Any]]:
    """Per closed round: its wall time and the mean seconds of each part over its participants."""
    import sqlite3

    con = sqlite3.connect(db_path)
    rounds = con.execute(
        "select id, number, opened_at, closed_at, stats, base_version from rounds where state = 'closed' order by number"
    ).fetchall()
    out = []
    for rid, number, opened, closed, stats_json, base in rounds:
        stats = json.loads(stats_json or "{}")
        agg = float(stats.get("aggregation_s") or 0.0)
        rows = con.execute(
            "select client_id, blob, metrics, created_at from updates where round_id = ?", (rid,)
        ).fetchall()
        parts: dict[str, list[float]] = {p: [] for p in PARTS}
        for cid, blob, metrics_json, created in rows:
            meta = wire.read_metadata(blob)
            timing = json.loads(meta.get("timing", "{}"))
            metrics = json.loads(metrics_json or "{}")
            if not timing:
                continue
            ev = con.execute(
                "select created_at from evaluations where client_id = ? and version = ?", (cid, base)
            ).fetchone()
            received = float(timing["task_received_at"])
            eval_done = float(ev[0]) if ev and opened <= ev[0] <= received else opened
            train = float(metrics.get("seconds", 0.0))
            trained = float(timing["trained_at"])
            download, slot = float(timing["download_s"]), float(timing["slot_wait_s"])
            parts["evaluation"].append(eval_done - opened)
            parts["poll"].append(received - eval_done)
            parts["download"].append(download)
            parts["slot_wait"].append(slot)
            parts["training"].append(train)
            parts["serialisation"].append(max(0.0, trained - received - download - slot - train))
            parts["upload"].append(created - trained)
            parts["others"].append(max(0.0, closed - created - agg))
            parts["aggregation"].append(min(agg, closed - created))
        if not parts["training"]:
            continue
        mean = {p: sum(v) / len(v) for p, v in parts.items()}
        out.append({"round": number, "wall_s": closed - opened, "participants": len(rows), "mean_s": mean})
    con.close()
    return out


def simulate_command(args: argparse.Namespace, out: Path) -> list[str]:
    """The federation: ``fedprompt simulate`` with every client in every round."""
    return [
        str(Path(sys.executable).parent / "fedprompt"),
        "simulate",
        "--dataset",
        "sst2",
        "--clients",
        str(args.clients),
        "--fraction",
        "1.0",
        "--rounds",
        str(args.rounds),
        "--local-steps",
        str(args.local_steps),
        "--train-limit",
        str(args.train_limit),
        "--eval-limit",
        str(args.eval_limit),
        "--out",
        str(out),
    ]


def baseline_command(args: argparse.Namespace, out: Path) -> list[str]:
    """The baseline: the same training steps (clients × rounds × local steps) in one process,
    ``fedprompt-worker train-local``, evaluated once at the end on the same test subset."""
    return [
        str(Path(sys.executable).parent / "fedprompt-worker"),
        "train-local",
        "--dataset",
        "sst2",
        "--steps",
        str(args.clients * args.rounds * args.local_steps),
        "--train-limit",
        str(args.train_limit),
        "--eval-limit",
        str(args.eval_limit),
        "--eval-every",
        "0",
        "--out",
        str(out),
    ]


def run_simulate(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """One federation, its rounds split into parts."""
    cmd = simulate_command(args, out)
    t0 = time.time()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.time() - t0
    rounds = split_rounds(out / "fedprompt.db")
    results = json.loads((out / "results.json").read_text())
    total_round = sum(r["wall_s"] for r in rounds)
    shares = {}
    for group, members in GROUPS.items():
        secs = sum(sum(r["mean_s"][m] for m in members) for r in rounds)
        shares[group] = secs / total_round if total_round else None
    return {
        "simulate_command": " ".join(cmd[1:]).replace(str(out), "<out>"),
        "simulate_wall_s": wall,
        "rounds_wall_s": total_round,
        "outside_rounds_s": wall - total_round,
        "share_of_round": shares,
        "rounds": rounds,
        "final_accuracy": (results.get("rounds") or [{}])[-1].get("accuracy"),
    }


def run_baseline(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """The same steps trained centrally."""
    cmd = baseline_command(args, out)
    t0 = time.time()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.time() - t0
    report = json.loads(out.read_text())
    return {
        "command": " ".join(cmd[1:]).replace(str(out), "<out>"),
        "wall_s": wall,
        "steps": report.get("steps_done"),
        "train_s": report.get("train_seconds"),
        "load_s": report.get("load_seconds"),
        "final_accuracy": report.get("final_accuracy"),
    }


def overhead(sim: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """The federation's time as ratios to the same steps trained centrally: the whole run (both
    start, load the model, train and evaluate) and the rounds alone against the training alone."""
    return {
        "wall": ratio(sim["simulate_wall_s"], base["wall_s"]),
        "rounds_vs_training": ratio(sim["rounds_wall_s"], base["train_s"]),
    }


def main(argv: list[str] | None = None) -> None:
    """Run simulate and its baseline in interleaved repeats, split the rounds, write bench/results/e2e.json."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--local-steps", type=int, default=5)
    ap.add_argument("--train-limit", type=int, default=2000)
    ap.add_argument("--eval-limit", type=int, default=100)
    ap.add_argument(
        "--repeats", type=int, default=3, help="pairs of (simulate, train-local), order alternating"
    )
    ap.add_argument("--keep", default=None, help="keep the first simulate's --out folder here")
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args(argv)
    repeats: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fedprompt-e2e-") as tmp:
        for number in range(args.repeats):
            sim_out = Path(args.keep) if args.keep and number == 0 else Path(tmp) / f"sim-{number}"
            base_out = Path(tmp) / f"train-local-{number}.json"
            order = ["simulate", "train-local"] if number % 2 == 0 else ["train-local", "simulate"]
            done: dict[str, dict[str, Any]] = {}
            for name in order:
                load0 = list(os.getloadavg())
                done[name] = (
                    run_simulate(args, sim_out) if name == "simulate" else run_baseline(args, base_out)
                )
                done[name].update(loadavg_start=load0, loadavg_end=list(os.getloadavg()))
            ratios = overhead(done["simulate"], done["train-local"])
            repeats.append({"repeat": number, "order": order, **done, "vs_train_local": ratios})
            print(
                f"[{number}] simulate {done['simulate']['simulate_wall_s']:.0f} s, train-local "
                f"{done['train-local']['wall_s']:.0f} s: {ratios['wall'] or 0:.2f}x",
                flush=True,
            )
    first = repeats[0]["simulate"]
    payload = {
        **{k: v for k, v in first.items() if not k.startswith("loadavg")},
        "clients": args.clients,
        "repeats": repeats,
        "summary": {
            key: spread([r["vs_train_local"][key] for r in repeats]) for key in ("wall", "rounds_vs_training")
        },
    }
    path = write_result("e2e", payload, out_dir=Path(args.out_dir) if args.out_dir else None)
    print(
        f"simulate {first['simulate_wall_s']:.0f} s, rounds {first['rounds_wall_s']:.0f} s: "
        + ", ".join(f"{g} {s * 100:.1f} %" for g, s in first["share_of_round"].items() if s is not None)
        + f"; wrote {path}"
    )


if __name__ == "__main__":
    main()
