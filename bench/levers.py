"""Where a CPU training step could go faster: bf16 autocast, processes vs threads, several clients per batch.

    python -m bench.levers [--block 4 --pairs 6 --bf16-pairs 3 --accuracy-steps 200]

Every lever is measured against the engine's default path (float32, mean-pool scoring, 2 torch
threads, batch 16, length 64) on the same SST-2 batches, in pairs of blocks run back to back with
the order alternating, so a burst of load from other jobs hits both sides of a pair; each figure is
the median over the pairs of (default seconds / lever seconds) per unit of work, so > 1 means the
lever is faster.

- bf16: ``torch.autocast("cpu", torch.bfloat16)`` around the engine's own ``train``; then, if bf16
  was faster, both precisions train ``--accuracy-steps`` steps from the same prompt on the same
  batches and are evaluated on the whole test split (the accuracy the lever would cost). The file
  records the CPU's bf16 flags: without AVX512-BF16 or AMX-BF16, bf16 is emulated and slower.
- processes: two processes of 1 thread each training at once (what ``simulate --processes 2`` does)
  vs one process of 2 threads training the same number of steps one after another.
- one thread: the same steps on 1 torch thread instead of 2 (< 1: what a trainer alone on the
  machine loses when its process was started with cores ÷ P threads; ``worker.slots.ElasticThreads``
  gives it the idle cores).
- batched clients: one step of batch 2B (two clients' batches stacked, as a batched multi-client
  forward would run) vs two steps of batch B; > 1 would mean stacking clients pays.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from fedprompt.shared.local import cpu_flags
from fedprompt.shared.spec import DEFAULT_MODEL
from fedprompt.worker.data import load_dataset, preset_for
from fedprompt.worker.engine import PromptEngine

from bench.common import self_peak_rss_mib, write_result

LR = 0.01  # mean-pool scoring's rate (bench/scoring.py)


def _engine(threads: int, max_length: int) -> PromptEngine:
    preset = preset_for("sst2")
    assert preset is not None
    return PromptEngine.load(
        DEFAULT_MODEL,
        template=preset.template,
        verbalizer=preset.verbalizer,
        num_virtual_tokens=20,
        max_length=max_length,
        seed=0,
        num_threads=threads,
    )


def _precision(bf16: bool) -> contextlib.AbstractContextManager[Any]:
    return torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()


def _timed(engine: PromptEngine, train: list[Any], *, steps: int, batch: int, seed: int, bf16: bool) -> float:
    t0 = time.perf_counter()
    with _precision(bf16):
        engine.train(train, steps=steps, batch_size=batch, lr=LR, seed=seed)
    return time.perf_counter() - t0


def _paired(name: str, pairs: int, default: Any, lever: Any) -> dict[str, Any]:
    """Alternate (default, lever) calls returning seconds per unit of work; pair 0 is a warm-up."""
    ratios, base_s, lever_s = [], [], []
    for i in range(pairs + 1):
        took = {}
        for side in ("default", "lever") if i % 2 == 0 else ("lever", "default"):
            took[side] = (default if side == "default" else lever)(i)
        if i == 0:
            continue
        base_s.append(took["default"])
        lever_s.append(took["lever"])
        ratios.append(took["default"] / took["lever"])
        print(f"{name} pair {i}: default {took['default']:.3f} s, lever {took['lever']:.3f} s", flush=True)
    return {
        "default_seconds_median": statistics.median(base_s),
        "lever_seconds_median": statistics.median(lever_s),
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "paired_ratios": ratios,
    }


def _cpu_flags() -> dict[str, bool]:
    """Whether this CPU has native bf16 arithmetic (AVX512-BF16, AMX-BF16): what decides the bf16 lever."""
    flags = cpu_flags() or frozenset()
    return {name: name in flags for name in ("avx512_bf16", "amx_bf16", "avx512f")}


def _child(conn: Any, steps: int, max_length: int, train_limit: int) -> None:
    """A one-thread training process: load once, then train `steps` steps whenever asked."""
    torch.set_num_threads(1)
    engine = _engine(1, max_length)
    train = list(load_dataset("sst2", "train").sample(train_limit, 0))
    conn.send("ready")
    while (seed := conn.recv()) is not None:
        conn.send(_timed(engine, train, steps=steps, batch=16, seed=seed, bf16=False))


def main(argv: list[str] | None = None) -> None:
    """Measure each lever against the default path; write bench/results/levers.json."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--block", type=int, default=4, help="training steps per block")
    ap.add_argument("--pairs", type=int, default=6, help="pairs of blocks per lever (after a warm-up pair)")
    ap.add_argument(
        "--bf16-pairs",
        type=int,
        default=3,
        help="pairs for bf16 (a block takes minutes where bf16 is emulated)",
    )
    ap.add_argument("--accuracy-steps", type=int, default=200, help="steps before the bf16 accuracy check")
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--train-limit", type=int, default=8000)
    ap.add_argument("--out-dir", default=None)
    ap.add_argument(
        "--name", default="levers", help="result file name (levers-amx: the run on a CPU with AMX-BF16)"
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    train = list(load_dataset("sst2", "train").sample(args.train_limit, 0))
    test = list(load_dataset("sst2", "test"))
    engine = _engine(2, args.max_length)
    init = engine.get_prompt()
    n = args.block

    def run(bf16: bool, batch: int = 16, steps: int = n) -> Any:
        def call(i: int) -> float:
            engine.set_prompt(init)
            return _timed(engine, train, steps=steps, batch=batch, seed=i, bf16=bf16) / (steps * batch)

        return call

    levers: dict[str, Any] = {}
    levers["bf16"] = _paired("bf16", args.bf16_pairs, run(False), run(True))
    levers["batched_clients"] = _paired(
        "batched", args.pairs, run(False), run(False, batch=32, steps=n // 2 or 1)
    )

    def one_thread(i: int) -> float:
        torch.set_num_threads(1)
        try:
            return run(False)(i)
        finally:
            torch.set_num_threads(2)

    # what a lone trainer loses on 1 thread (a pool process of P = cores, before elastic threads)
    levers["one_thread"] = _paired("one thread", args.pairs, run(False), one_thread)

    ctx = mp.get_context("spawn")
    links = []
    for _ in range(2):
        parent, child = ctx.Pipe()
        ctx.Process(target=_child, args=(child, n, args.max_length, args.train_limit), daemon=True).start()
        links.append(parent)
    for link in links:
        link.recv()

    def two_processes(i: int) -> float:
        t0 = time.perf_counter()
        for link in links:
            link.send(i)
        for link in links:
            link.recv()
        return (time.perf_counter() - t0) / (2 * n)

    def one_process(i: int) -> float:
        engine.set_prompt(init)
        t0 = time.perf_counter()
        for k in range(2):
            engine.train(train, steps=n, batch_size=16, lr=LR, seed=i * 2 + k)
        return (time.perf_counter() - t0) / (2 * n)

    levers["processes"] = _paired("processes", args.pairs, one_process, two_processes)
    for link in links:
        link.send(None)

    accuracy: dict[str, float] = {}
    # where bf16 is slower (a CPU without native bf16 arithmetic emulates it), its accuracy is moot and
    # the check would take hours: it runs only when the lever pays
    precisions = (("float32", False), ("bf16", True)) if levers["bf16"]["ratio"] > 1 else ()
    for name, bf16 in precisions:
        engine.set_prompt(init)
        with _precision(bf16):
            engine.train(train, steps=args.accuracy_steps, batch_size=16, lr=LR, seed=7)
            accuracy[name] = engine.evaluate(test).accuracy
        print(f"{name}: {accuracy[name]:.4f} after {args.accuracy_steps} steps", flush=True)
    result = {
        "model": DEFAULT_MODEL,
        "dataset": "sst2",
        "scoring": engine.scoring,
        "lr": LR,
        "batch_size": 16,
        "max_length": args.max_length,
        "steps_per_block": n,
        "units": "seconds per training example (bf16, batched) or per step (processes)",
        "levers": levers,
        "accuracy_steps": args.accuracy_steps,
        "test_examples": len(test),
        "accuracy": accuracy,
        "accuracy_skipped": None if accuracy else "bf16 was slower than float32: no accuracy check",
        "cpu_flags": _cpu_flags(),
        "peak_rss_mib": self_peak_rss_mib(),
    }
    path = write_result(args.name, result, out_dir=Path(args.out_dir) if args.out_dir else None)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
