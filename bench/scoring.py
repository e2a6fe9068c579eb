"""MiniLM's two scorings on the same batches: steps/s as a paired ratio, and test accuracy after a fixed
number of steps for each.

    python -m bench.scoring [--steps 300 --checkpoints 100,200,300 --lr-tied 0.3 --lr-mean-pool 0.01]

all-MiniLM-L6-v2 ships without its MLM head. The earlier default read the label words at [MASK] through
the tied input embeddings ("tied-embeddings"); the default now is mean-pool similarity ("mean-pool"):
20 × the cosine of the mean-pooled output with each label phrase. Both engines train the same SST-2
examples in the same seeded batches, each at its own learning rate (the paper's 0.3 for the tied
readout, 0.01 for mean-pool), in alternating blocks so that a burst of load hits both; after each
checkpoint both are evaluated on the whole test split (872 sentences).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from fedprompt.shared.spec import DEFAULT_MODEL
from fedprompt.worker.data import load_dataset, preset_for
from fedprompt.worker.engine import PromptEngine

from bench.common import self_peak_rss_mib, write_result

SCORINGS = ("tied-embeddings", "mean-pool")


def main(argv: list[str] | None = None) -> None:
    """Train both scorings block by block on the same batches; write bench/results/scoring.json."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoints", default="100,200,300", help="evaluate after these many steps")
    ap.add_argument("--block", type=int, default=25, help="steps per block (each side, back to back)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--train-limit", type=int, default=8000)
    ap.add_argument("--lr-tied", type=float, default=0.3)
    ap.add_argument("--lr-mean-pool", type=float, default=0.01)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-limit", type=int, default=None, help="a seeded subset of the test split")
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    checkpoints = sorted(int(c) for c in args.checkpoints.split(","))
    train = list(load_dataset("sst2", "train").sample(args.train_limit, 0))
    test = list(load_dataset("sst2", "test").sample(args.eval_limit, 0))
    preset = preset_for("sst2")
    assert preset is not None
    lrs = {"tied-embeddings": args.lr_tied, "mean-pool": args.lr_mean_pool}
    engines = {
        scoring: PromptEngine.load(
            DEFAULT_MODEL,
            template=preset.template,
            verbalizer=preset.verbalizer,
            num_virtual_tokens=20,
            max_length=args.max_length,
            seed=0,
            num_threads=args.threads,
            scoring=scoring,
        )
        for scoring in SCORINGS
    }
    accuracy: dict[str, list[dict[str, float]]] = {s: [] for s in SCORINGS}
    for scoring, engine in engines.items():
        accuracy[scoring].append({"step": 0, "accuracy": engine.evaluate(test).accuracy})
    seconds: dict[str, list[float]] = {s: [] for s in SCORINGS}
    paired: list[float] = []
    done, block = 0, 0
    while done < checkpoints[-1]:
        steps = min(args.block, next(c for c in checkpoints if c > done) - done)
        order = SCORINGS if block % 2 == 0 else SCORINGS[::-1]
        took = {}
        for scoring in order:
            t0 = time.perf_counter()
            # one optimiser per block, as a federation's round has; the batch seed follows the step count
            engines[scoring].train(
                train, steps=steps, batch_size=args.batch_size, lr=lrs[scoring], seed=1000 + done
            )
            took[scoring] = (time.perf_counter() - t0) / steps
            seconds[scoring].append(took[scoring])
        paired.append(took["tied-embeddings"] / took["mean-pool"])
        done += steps
        block += 1
        if done in checkpoints:
            for scoring, engine in engines.items():
                acc = engine.evaluate(test).accuracy
                accuracy[scoring].append({"step": done, "accuracy": acc})
            print(
                f"step {done}: "
                + ", ".join(f"{s} {accuracy[s][-1]['accuracy']:.3f}" for s in SCORINGS)
                + f"; s/step tied {took['tied-embeddings']:.3f}, mean-pool {took['mean-pool']:.3f}",
                flush=True,
            )
    result = {
        "model": DEFAULT_MODEL,
        "dataset": "sst2",
        "test_examples": len(test),
        "batch_size": args.batch_size,
        "max_length": args.max_length,
        "threads": args.threads,
        "lr": lrs,
        "template": preset.template,
        "verbalizer": preset.verbalizer,
        "accuracy": accuracy,
        "seconds_per_step_median": {s: statistics.median(v) for s, v in seconds.items()},
        # the figure: the median over blocks of (tied seconds / mean-pool seconds) per step, same batches
        "speed_ratio_mean_pool_vs_tied": statistics.median(paired),
        "paired_ratios": paired,
        "peak_rss_mib": self_peak_rss_mib(),
    }
    path = write_result("scoring", result, out_dir=Path(args.out_dir) if args.out_dir else None)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
