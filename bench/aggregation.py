"""Aggregation: time and peak memory of every rule at K updates vs numpy.average over the stacked array.

    python -m bench.aggregation [--ks 10,100,1000,10000] [--repeats 3]

The baseline is ``numpy.average(stacked, axis=0, weights=w)`` over the same K updates already stacked
in one (K, 20, 384) float32 array: the reference a weighted mean is held to (not a lower bound: numpy
first builds a K-row float64 product, which a streaming sum avoids). Timings are the best of
``--repeats`` runs, rule and baseline interleaved so that a burst of load from other jobs hits both;
each pair's ratio (rule ÷ numpy of the same pair) is kept as ``repeat_ratios``.
Peak memory is what tracemalloc sees numpy allocate during the call (the inputs are not counted).
The "service" rows time the coordinator's own aggregation of a round (blobs from the database
→ prompt version), which is what a federation pays.
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
from fedprompt.coordinator.logic.aggregation import aggregate, available_rules
from fedprompt.shared import wire

from bench.common import ratio, write_result

SHAPE = (20, 384)
PARAMS: dict[str, dict[str, Any]] = {
    "fedavg": {},
    "median": {},
    "trimmed_mean": {"beta": 0.1},
    "krum": {"f": 1},
    "multi_krum": {"f": 1},
    "norm_bound": {"bound": 1.0},
    "stats_filter": {"k": 3.0},
}
# Memory a rule needs beyond its inputs, bytes, for K updates of d floats; rules above the limit are skipped.
MEMORY_LIMIT = 6 * 2**30


def _estimated_bytes(rule: str, k: int, d: int) -> int:
    if rule in ("krum", "multi_krum"):
        return 3 * k * k * 8 + 2 * k * d * 8  # pairwise distances (K, K), centred float64 copy
    return 3 * k * d * 8


def _timed(fn: Callable[[], Any]) -> float:
    gc.collect()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _peak(fn: Callable[[], Any]) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def make_updates(k: int, seed: int = 0) -> tuple[list[tuple[dict[str, np.ndarray], float]], np.ndarray]:
    """K updates with random prompts and sample counts, and the same as one stacked array."""
    rng = np.random.default_rng(seed)
    stacked = (rng.standard_normal((k, *SHAPE)) * 0.05).astype(np.float32)
    weights = rng.integers(10, 1000, size=k).astype(np.float64)
    updates = [({"prompt_embeddings": stacked[i]}, float(weights[i])) for i in range(k)]
    return updates, weights


def bench_k(k: int, rules: list[str], repeats: int) -> dict[str, Any]:
    """Every rule at K updates against the numpy bound."""
    updates, weights = make_updates(k)
    stacked = np.stack([t["prompt_embeddings"] for t, _ in updates])
    d = stacked[0].size
    glob = {"prompt_embeddings": np.zeros(SHAPE, np.float32)}

    def baseline() -> Any:
        return np.average(stacked, axis=0, weights=weights)

    base_times: list[float] = []
    rows: dict[str, Any] = {}
    for rule in rules:
        need = _estimated_bytes(rule, k, d)
        if need > MEMORY_LIMIT:
            rows[rule] = {"skipped": f"needs about {need / 2**30:.0f} GiB (pairwise distances)"}
            continue

        def run(rule: str = rule) -> Any:
            return aggregate(rule, updates, params=PARAMS.get(rule, {}), global_tensors=glob)

        # the floor is on FedAvg at K = 10,000: it always gets every repeat; slow robust rules get one there
        reps = repeats if (need < 2**30 and k <= 1000) or rule == "fedavg" else 1
        times, pairs = [], []
        for _ in range(reps):
            base_times.append(_timed(baseline))
            times.append(_timed(run))
            pairs.append(times[-1] / base_times[-1])
        if rule == "fedavg":  # the result is the weighted mean numpy computes
            np.testing.assert_allclose(run().tensors["prompt_embeddings"], baseline(), rtol=1e-5, atol=1e-6)
        rows[rule] = {"seconds": min(times), "peak_mib": _peak(run) / 2**20, "repeat_ratios": pairs}
    base_s = min(base_times) if base_times else _timed(baseline)
    base_mib = _peak(baseline) / 2**20
    for row in rows.values():
        if "seconds" in row:
            row["time_ratio"] = ratio(row["seconds"], base_s)
            row["peak_ratio"] = ratio(row["peak_mib"], base_mib)
    service = bench_service(k, updates)
    return {
        "k": k,
        "inputs_mib": stacked.nbytes / 2**20,
        "numpy": {"seconds": base_s, "peak_mib": base_mib},
        "rules": rows,
        "service_fedavg": {
            **service,
            "time_ratio": ratio(service["seconds"], base_s),
            "peak_ratio": ratio(service["peak_mib"], base_mib),
        },
    }


def bench_service(k: int, updates: list[tuple[dict[str, np.ndarray], float]]) -> dict[str, Any]:
    """The coordinator's aggregation of one round of K uploads (SQLite in memory), FedAvg."""
    from bench.agg_service import aggregate_round

    blobs = [wire.encode(t, {"num_samples": str(int(w)), "method": "prompt_tuning"}) for t, w in updates]
    return aggregate_round(blobs)


def main(argv: list[str] | None = None) -> None:
    """Run the grid and write bench/results/aggregation.json."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ks", default="10,100,1000,10000")
    ap.add_argument("--rules", default=",".join(available_rules()))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args(argv)
    ks = [int(x) for x in args.ks.split(",")]
    rules = args.rules.split(",")
    results: list[dict[str, Any]] = []
    # The objects alive before the benchmark (a caller's, e.g. a test process's whole heap) are
    # frozen out of the collector, so the gc.collect() before each timing walks only the
    # benchmark's own objects: a large caller's heap made every collection take seconds.
    gc.collect()
    gc.freeze()
    try:
        for k in ks:
            res = bench_k(k, rules, args.repeats)
            results.append(res)
            fed = res["rules"].get("fedavg", {})
            print(
                f"K={k}: numpy {res['numpy']['seconds'] * 1e3:.1f} ms; fedavg {fed.get('seconds', 0) * 1e3:.1f} ms "
                f"({fed.get('time_ratio') or 0:.2f}x, peak {fed.get('peak_ratio') or 0:.2f}x); service "
                f"{res['service_fedavg']['seconds'] * 1e3:.1f} ms ({res['service_fedavg']['time_ratio']:.2f}x)",
                flush=True,
            )
    finally:
        gc.unfreeze()
    from pathlib import Path

    path = write_result(
        "aggregation",
        {"shape": list(SHAPE), "dtype": "float32", "params": PARAMS, "results": results},
        out_dir=Path(args.out_dir) if args.out_dir else None,
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
