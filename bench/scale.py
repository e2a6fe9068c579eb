"""Wall time against the number of enrolled clients at a fixed number trained per round (C·K).

    python -m bench.scale [--sizes 20:0.5,100:0.1] [--rounds 6] [--local-steps 10] [--repeats 3]

The same federation (SST-2, Dirichlet label skew α = 1.0, the demo's three label words per class, two
training pool processes) with K = 20 clients at C = 0.5 and K = 100 at C = 0.1: ten clients train in
every round of both, so the training work is the same and what grows with K is the coordinator's
enrolment, the idle clients' long-polls and (where every client evaluates) the evaluation tasks.
Each repeat runs every size once, the order alternating from repeat to repeat; the ratio of each
larger size to the first one is taken within the repeat. The figure is the federation's own wall time
(``results.json`` ``wall_seconds``: from the first round's opening to the last one's close), beside
the whole command's and the final accuracy.
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

from fedprompt.sim.options import DEFAULT_EVALUATORS

from bench.common import ratio, spread, write_result

VERBALIZER = "terrible,awful,bad;great,wonderful,good"


def parse_sizes(text: str) -> list[tuple[int, float]]:
    """``"20:0.5,100:0.1"`` → [(20, 0.5), (100, 0.1)]."""
    sizes = []
    for part in text.split(","):
        k, _, c = part.partition(":")
        sizes.append((int(k), float(c)))
    return sizes


def simulate_command(args: argparse.Namespace, k: int, c: float, out: Path) -> list[str]:
    """One federation of K clients at fraction C."""
    cmd = [
        str(Path(sys.executable).parent / "fedprompt"),
        "simulate",
        "--dataset",
        "sst2",
        "--clients",
        str(k),
        "--fraction",
        str(c),
        "--rounds",
        str(args.rounds),
        "--local-steps",
        str(args.local_steps),
        "--partition",
        args.partition,
        "--processes",
        "2",
        "--verbalizer",
        VERBALIZER,
        "--seed",
        str(args.seed),
        "--out",
        str(out),
    ]
    # 0: every client evaluates its share (--evaluators K, the default before this build)
    cmd += ["--evaluators", str(min(args.evaluators, k) if args.evaluators else k)]
    return cmd


def run_one(args: argparse.Namespace, k: int, c: float, out: Path) -> dict[str, Any]:
    """One federation: its own wall time, the command's, the final accuracy and the peak memory."""
    cmd = simulate_command(args, k, c, out)
    load0 = list(os.getloadavg())
    t0 = time.time()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    command_s = time.time() - t0
    results = json.loads((out / "results.json").read_text())
    return {
        "clients": k,
        "fraction": c,
        "command": " ".join(cmd[1:]).replace(str(out), "<out>"),
        "federation_s": results["wall_seconds"],
        "command_s": command_s,
        "final_accuracy": results["final_accuracy"],
        "peak_rss_mib": (results.get("peak_rss_bytes") or 0) / 2**20,
        "loadavg_start": load0,
        "loadavg_end": list(os.getloadavg()),
    }


def main(argv: list[str] | None = None) -> None:
    """Run the sizes in interleaved repeats and write bench/results/NAME.json (scale.json)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="20:0.5,100:0.1", help="K:C pairs; the first is the baseline")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--local-steps", type=int, default=10)
    ap.add_argument("--partition", default="label:1.0")
    ap.add_argument(
        "--evaluators",
        type=int,
        default=DEFAULT_EVALUATORS,
        help=f"simulate's --evaluators at every size (default {DEFAULT_EVALUATORS}, its own above "
        f"{DEFAULT_EVALUATORS} clients); 0: every client evaluates",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--name", default="scale", help="the result file's name: NAME.json")
    args = ap.parse_args(argv)
    sizes = parse_sizes(args.sizes)
    repeats: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fedprompt-scale-") as tmp:
        for number in range(args.repeats):
            order = sizes if number % 2 == 0 else sizes[::-1]
            runs = {k: run_one(args, k, c, Path(tmp) / f"k{k}-{number}") for k, c in order}
            base = runs[sizes[0][0]]
            ratios = {str(k): ratio(runs[k]["federation_s"], base["federation_s"]) for k, _ in sizes[1:]}
            repeats.append(
                {
                    "repeat": number,
                    "order": [k for k, _ in order],
                    "runs": [runs[k] for k, _ in sizes],
                    "ratios": ratios,
                }
            )
            print(
                f"[{number}] "
                + ", ".join(
                    f"K={k} {runs[k]['federation_s']:.0f} s ({runs[k]['final_accuracy'] * 100:.1f} %)"
                    for k, _ in sizes
                )
                + "; "
                + ", ".join(f"K={k}/K={sizes[0][0]} {r or 0:.3f}x" for k, r in ratios.items()),
                flush=True,
            )
    summary = {k: spread([r["ratios"][k] for r in repeats]) for k in repeats[0]["ratios"]}
    payload = {
        "sizes": [{"clients": k, "fraction": c} for k, c in sizes],
        "settings": {
            "rounds": args.rounds,
            "local_steps": args.local_steps,
            "partition": args.partition,
            "evaluators": args.evaluators or None,
            "seed": args.seed,
            "verbalizer": VERBALIZER,
        },
        "repeats": repeats,
        "summary": summary,
    }
    path = write_result(args.name, payload, out_dir=Path(args.out_dir) if args.out_dir else None)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
