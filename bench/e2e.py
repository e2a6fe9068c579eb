"""End to end: `fedprompt simulate` on 10 clients, its wall time split into training, communication,
serialisation, evaluation, aggregation and idle.

    python -m bench.e2e [--clients 10 --rounds 2 --local-steps 5 --train-limit 2000]

The split comes from what the federation itself records: the coordinator's round history (opened,
closed, ``stats.aggregation_s``), each stored update (its arrival time, the worker's training seconds
and the ``timing`` metadata the worker stamps: task received, download seconds, wait for a training
slot, training finished) and each evaluation's arrival. For every participant of a round:

    round wall = evaluation of the previous version + long-poll delivery + download + slot wait
                 + training + (prompt load, release, serialisation) + upload
                 + wait for the other participants + aggregation

All processes share one clock (loopback). The shares are averaged over participants and rounds; the
baseline is the round's own wall time, so every figure is a share of the same run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import write_result
from shared import wire

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


def main(argv: list[str] | None = None) -> None:
    """Run simulate, split its rounds, write bench/results/e2e.json."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--local-steps", type=int, default=5)
    ap.add_argument("--train-limit", type=int, default=2000)
    ap.add_argument("--eval-limit", type=int, default=100)
    ap.add_argument("--keep", default=None, help="keep simulate's --out folder here")
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fedprompt-e2e-") as tmp:
        out = Path(args.keep) if args.keep else Path(tmp) / "sim"
        cmd = [
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
    payload = {
        "simulate_command": " ".join(cmd[1:]).replace(str(out), "<out>"),
        "clients": args.clients,
        "simulate_wall_s": wall,
        "rounds_wall_s": total_round,
        "outside_rounds_s": wall - total_round,
        "share_of_round": shares,
        "rounds": rounds,
        "final_accuracy": (results.get("rounds") or [{}])[-1].get("accuracy"),
    }
    path = write_result("e2e", payload, out_dir=Path(args.out_dir) if args.out_dir else None)
    print(
        f"simulate {wall:.0f} s, rounds {total_round:.0f} s: "
        + ", ".join(f"{g} {s * 100:.1f} %" for g, s in shares.items() if s is not None)
        + f"; wrote {path}"
    )


if __name__ == "__main__":
    main()
