"""Every floor in one table: the figure, its same-run baseline, the ratio, its spread over the repeats, met or not.

    python -m bench.floors [--results bench/results] [--out BENCHMARKS.md]

Reads the result files ``make bench`` writes (``comm.json``, ``aggregation.json``, ``ingest.json``,
``worker.json``, ``e2e.json``), prints the table and writes it into BENCHMARKS.md between
``<!-- bench:floors -->`` and ``<!-- /bench:floors -->``.

A floor is *met* only when the result holds at least ``MIN_REPEATS`` repeats, each measured beside
its baseline, and every repeat meets it; when the median meets it but some repeats do not, the table
says how many did. A result file without repeats (written before the benchmarks recorded them) is
shown with its one figure and "1 run, repeats pending", never as met.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import RESULTS, ROOT, replace_block

MIN_REPEATS = 3
COMM_FLOOR = 1.05
FEDAVG_FLOOR = 2.0
FEDAVG_K = 10_000
INGEST_K = 1000
INGEST_C = 1.0
INGEST_WIDTH = 384
CPU_PER_REQUEST_MS = 1.5  # the coordinator's CPU over a run ÷ the requests it answered
DELIVERY_P99_S = 5.0  # a train task's arrival after its round opened
ROUNDS_PER_MIN = 6.0
WORKER_FLOOR = 0.95
PEERS_GOAL = 1.0  # fedprompt ÷ Flower on the same federation: wall time and peak memory
SCALE_FLOOR = 1.10  # K = 100 ÷ K = 20 at the same C·K: the federation's wall time
MARKER = "floors"


@dataclass
class Floor:
    """One row of the table."""

    floor: str
    figure: str
    baseline: str
    ratio: float | None
    spread: tuple[float, float] | None
    runs: str
    load: str
    status: str
    source: str


def verdict(values: Sequence[float], meets: Callable[[float], bool], *, repeated: bool) -> str:
    """Met, met in some repeats, not met, or pending (fewer than MIN_REPEATS repeats or none recorded)."""
    if not values:
        return "no result"
    n = len(values)
    if not repeated or n == 1:
        return "1 run, repeats pending"
    if n < MIN_REPEATS:
        return f"{n} runs, repeats pending"
    good = sum(1 for v in values if meets(v))
    if good == n:
        return f"met ({n} of {n} repeats)"
    if meets(statistics.median(values)):
        return f"median met, {good} of {n} repeats"
    return f"not met ({good} of {n} repeats)"


def _seconds(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x * 1e3:.2f} ms" if x < 0.01 else f"{x * 1e3:.0f} ms" if x < 1 else f"{x:.2f} s"


def _ratio(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}×"


def _load(values: Sequence[float]) -> str:
    if not values:
        return "–"
    lo, hi = min(values), max(values)
    return f"{lo:.1f}" if f"{lo:.1f}" == f"{hi:.1f}" else f"{lo:.1f}–{hi:.1f}"


def _end_load(doc: dict[str, Any]) -> str:
    return f"{doc['machine']['loadavg'][0]:.1f} at the end"


def _spread(values: Sequence[float], repeated: bool) -> tuple[float, float] | None:
    return (min(values), max(values)) if repeated and len(values) > 1 else None


def comm_floor(doc: dict[str, Any]) -> Floor:
    """Bytes per client per round, MiniLM prompt tuning, ÷ (raw tensor bytes + headers)."""
    row = next(
        r for r in doc["rows"] if r["model"].startswith("all-MiniLM") and r["method"] == "prompt_tuning"
    )
    values = row.get("repeat_ratios") or [row["ratio_to_raw_plus_headers"]]
    repeated = "repeat_ratios" in row
    return Floor(
        floor=f"bytes per client per round, MiniLM prompt tuning ≤ {COMM_FLOOR}× (raw tensors + headers)",
        figure=f"{row['wire_total']:,} B",
        baseline=f"{row['raw_plus_headers']:,} B",
        ratio=statistics.median(values),
        spread=_spread(values, repeated),
        runs=f"{len(values)} repeats" if repeated else "1 run",
        load=_end_load(doc),
        status=verdict(values, lambda v: v <= COMM_FLOOR, repeated=repeated),
        source="comm.json",
    )


def fedavg_floor(doc: dict[str, Any]) -> Floor | None:
    """FedAvg ÷ numpy.average at K = 10,000."""
    res = next((r for r in doc["results"] if r["k"] == FEDAVG_K), None)
    fed = (res or {}).get("rules", {}).get("fedavg")
    if res is None or not fed or "seconds" not in fed:
        return None
    repeated = "repeat_ratios" in fed
    values = fed.get("repeat_ratios") or [fed["time_ratio"]]
    return Floor(
        floor=f"FedAvg ≤ {FEDAVG_FLOOR:g}× numpy.average at K = {FEDAVG_K:,}",
        figure=f"{_seconds(fed['seconds'])} (best)",
        baseline=f"{_seconds(res['numpy']['seconds'])} (best)",
        ratio=statistics.median(values) if repeated else fed["time_ratio"],
        spread=_spread(values, repeated),
        runs=f"{len(values)} repeats" if repeated else "1 run",
        load=_end_load(doc),
        status=verdict(values, lambda v: v <= FEDAVG_FLOOR, repeated=repeated),
        source="aggregation.json",
    )


def _ingest_point(doc: dict[str, Any]) -> dict[str, Any] | None:
    for p in doc.get("points", []):
        if (p["k"], p["c"], p["hidden"]) == (INGEST_K, INGEST_C, INGEST_WIDTH):
            return p
    return None


def ingest_floors(doc: dict[str, Any], source: str = "ingest.json") -> list[Floor]:
    """Per backend at K = 1,000, C = 1.0, on absolute figures of the coordinator's own work (every repeat
    with 0 errors): CPU per request ≤ CPU_PER_REQUEST_MS, train-task delivery p99 ≤ DELIVERY_P99_S,
    at least ROUNDS_PER_MIN rounds a minute. The ratio is to the previous build's coordinator in the
    same repeat (`bench.ingest --previous`); the null app's figure stands beside it as the framework's
    ceiling, not as a floor."""
    backends = doc.get("settings", {}).get("backends") or ["sqlite", "postgres"]
    previous = (doc.get("settings", {}).get("previous") or {}).get("commit")
    point = _ingest_point(doc)
    if point is None:
        return []
    runs = [r["runs"] for r in point["repeats"]]
    nulls = [r["null"] for r in runs]
    at = f"K = {INGEST_K:,}, C = {INGEST_C}"
    targets: list[tuple[str, float, Callable[[float], bool], Callable[[float | None], str], tuple[str, ...], str]] = [
        (f"coordinator CPU per request ≤ {CPU_PER_REQUEST_MS} ms", float("inf"),
         lambda v: v <= CPU_PER_REQUEST_MS, _ms, ("cpu_ms_per_request",), "cpu_ms_per_request"),
        (f"train-task delivery p99 ≤ {DELIVERY_P99_S:g} s", float("inf"),
         lambda v: v <= DELIVERY_P99_S, _seconds, ("train_delivery_s", "p99"), "train_delivery_p99"),
        (f"≥ {ROUNDS_PER_MIN:g} rounds per minute", 0.0,
         lambda v: v >= ROUNDS_PER_MIN, _per_min, ("rounds_per_min",), "rounds_per_min"),
    ]  # fmt: skip
    out = []
    for backend in backends:
        rows = [r.get(backend) for r in runs]
        if any(row is None for row in rows):
            continue
        before = [r.get(f"{backend}@previous") for r in runs]
        errors = [row["errors"] for row in rows]
        loads = [x for row in rows for x in (row["loadavg_start"][0], row["loadavg_end"][0])]
        n = len(rows)
        for label, worst, meets, show, path, ratio_key in targets:
            values = [_path(row, path) for row in rows]
            nulls_v = [_path(nl, path) for nl in nulls]
            ratios = [(row.get("vs_previous") or {}).get(ratio_key) for row in rows]
            present = [v for v in ratios if v is not None]
            baseline = f"null app {show(_median(nulls_v))}"
            if any(b is not None for b in before):
                prev = [_path(b, path) for b in before if b is not None]
                baseline = (
                    f"previous build{f' ({previous})' if previous else ''} {show(_median(prev))}; {baseline}"
                )
            out.append(
                Floor(
                    floor=f"{backend}: {at}: {label}, 0 errors",
                    figure=f"{show(_median(values))}, errors {sum(errors)}",
                    baseline=baseline,
                    ratio=_median(present),
                    spread=_spread(present, True),
                    runs=f"{n} repeats" if n > 1 else "1 run",
                    load=_load(loads),
                    status=verdict(
                        [  # a repeat with an error, or without the figure, fails
                            v if e == 0 and v is not None else worst
                            for e, v in zip(errors, values, strict=True)
                        ],
                        meets,
                        repeated=n > 1,
                    ),
                    source=source,
                )
            )
    return out


def _path(run: dict[str, Any] | None, path: tuple[str, ...]) -> float | None:
    value: Any = run
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, int | float) else None


def _ms(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f} ms"


def _per_min(x: float | None) -> str:
    return "–" if x is None else f"{x:.1f} rounds/min"


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def worker_floor(doc: dict[str, Any]) -> Floor:
    """The engine's training ÷ a bare torch loop, median of paired blocks (bare s ÷ engine s)."""
    pairs = doc.get("paired_ratios") or []
    repeated = bool(pairs)
    values = pairs or [doc["ratio"]]
    return Floor(
        floor=f"worker training ≥ {WORKER_FLOOR}× a bare torch loop",
        figure=f"{doc['engine_steps_per_s']:.3f} steps/s",
        baseline=f"{doc['bare_steps_per_s']:.3f} steps/s",
        ratio=doc["ratio"],
        spread=_spread(values, repeated),
        runs=f"{len(values)} paired blocks, 1 run" if repeated else "1 run",
        load=_end_load(doc),
        status=verdict(values, lambda v: v >= WORKER_FLOOR, repeated=repeated),
        source="worker.json",
    )


def e2e_floor(doc: dict[str, Any]) -> Floor:
    """The federation's whole run ÷ the same training steps in train-local (no floor set: reported)."""
    repeats = doc.get("repeats") or []
    values = [r["vs_train_local"]["wall"] for r in repeats if r["vs_train_local"]["wall"] is not None]
    sims = [r["simulate"]["simulate_wall_s"] for r in repeats]
    bases = [r["train-local"]["wall_s"] for r in repeats]
    loads = [
        x
        for r in repeats
        for part in ("simulate", "train-local")
        for x in (r[part]["loadavg_start"][0], r[part]["loadavg_end"][0])
    ]
    if not repeats:
        status = "baseline and repeats pending"
    elif len(values) >= MIN_REPEATS:
        status = f"reported ({len(values)} repeats)"
    else:
        status = verdict(values, lambda v: True, repeated=True)
    return Floor(
        floor="end to end: simulate ÷ the same steps in train-local (no floor; reported)",
        figure=f"{_median(sims) if sims else doc['simulate_wall_s']:.0f} s",
        baseline=f"{_median(bases):.0f} s" if bases else "none yet",
        ratio=_median(values),
        spread=_spread(values, True) if values else None,
        runs=f"{len(repeats)} repeats" if len(repeats) > 1 else "1 run",
        load=_load(loads) if loads else _end_load(doc),
        status=status,
        source="e2e.json",
    )


def peers_floors(doc: dict[str, Any]) -> list[Floor]:
    """fedprompt ÷ Flower on the same federation (bench/peers.py): wall time and peak memory, per repeat."""
    out = []
    loads = [doc["machine"]["loadavg"][0]]
    for key, what, fmt in (
        ("wall_s", "wall time", lambda v: f"{v:.0f} s"),
        ("peak_pss_mib", "peak memory (PSS)", lambda v: f"{v:,.0f} MiB"),
    ):
        cell = doc["summary"][key]
        values = cell["ratio"]["values"]
        out.append(
            Floor(
                floor=f"{what} ≤ {PEERS_GOAL}× Flower's on the same federation",
                figure=fmt(cell["fedprompt"]["median"]),
                baseline=fmt(cell["flower"]["median"]),
                ratio=cell["ratio"]["median"],
                spread=_spread(values, True),
                runs=f"{len(values)} repeats",
                load=_load(loads),
                status=verdict(values, lambda v: v <= PEERS_GOAL, repeated=True),
                source="peers.json",
            )
        )
    return out


def scale_floors(doc: dict[str, Any], source: str = "scale.json") -> list[Floor]:
    """Each larger K ÷ the first K at the same clients per round (bench/scale.py), per repeat; the
    floor names the evaluation policy the runs had (`--evaluators`; a file without it is from the
    builds where every client evaluated by default)."""
    repeats = doc.get("repeats") or []
    evaluators = (doc.get("settings") or {}).get("evaluators")
    policy = ", every client evaluating" if evaluators is None else f", {evaluators} evaluators"
    base = doc["sizes"][0]
    loads = [
        x for r in repeats for run in r["runs"] for x in (run["loadavg_start"][0], run["loadavg_end"][0])
    ]
    out = []
    for index, size in enumerate(doc["sizes"][1:], start=1):
        key = str(size["clients"])
        values = [r["ratios"][key] for r in repeats if r["ratios"].get(key) is not None]
        figures = [r["runs"][index]["federation_s"] for r in repeats]
        bases = [r["runs"][0]["federation_s"] for r in repeats]
        per_round = round(size["clients"] * size["fraction"])
        out.append(
            Floor(
                floor=f"K = {size['clients']} ÷ K = {base['clients']} at {per_round} clients per round{policy}: "
                f"federation wall time ≤ {SCALE_FLOOR:.2f}×",
                figure=f"{_median(figures):.0f} s",
                baseline=f"{_median(bases):.0f} s (K = {base['clients']})",
                ratio=_median(values),
                spread=_spread(values, True),
                runs=f"{len(values)} repeats",
                load=_load(loads),
                status=verdict(values, lambda v: v <= SCALE_FLOOR, repeated=True),
                source=source,
            )
        )
    return out


SOURCES: list[tuple[str, Callable[[dict[str, Any]], Floor | list[Floor] | None]]] = [
    ("comm.json", comm_floor),
    ("aggregation.json", fedavg_floor),
    # the ingest floors from the latest A/B run only (the earlier files stay in §2's tables)
    ("ingest-enrol-batches.json", lambda doc: ingest_floors(doc, "ingest-enrol-batches.json")),
    ("worker.json", worker_floor),
    ("e2e.json", e2e_floor),
    ("peers.json", peers_floors),
    ("scale.json", scale_floors),
    ("scale-evaluators.json", lambda doc: scale_floors(doc, "scale-evaluators.json")),
]


def collect(results: Path) -> list[Floor]:
    """Every floor whose result file exists."""
    out: list[Floor] = []
    for name, fn in SOURCES:
        path = results / name
        if not path.exists():
            continue
        got = fn(json.loads(path.read_text()))
        out += got if isinstance(got, list) else [got] if got is not None else []
    return out


def table(floors: Sequence[Floor]) -> str:
    """The floors as one markdown table."""
    lines = [
        "| floor | figure | baseline (same run) | ratio | spread (min–max) | runs | load (1 min) | status | file |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for f in floors:
        spread = "–" if f.spread is None else f"{_ratio(f.spread[0])}–{_ratio(f.spread[1])}"
        digits = 4 if f.source == "comm.json" else 3 if f.source == "worker.json" else 2
        lines.append(
            f"| {f.floor} | {f.figure} | {f.baseline} | **{_ratio(f.ratio, digits)}** | {spread} | {f.runs} "
            f"| {f.load} | {f.status} | `{f.source}` |"
        )
    return "\n".join(lines)


def render(text: str, results: Path) -> str:
    """Replace the floors block of a page with the table built from the result files."""
    return replace_block(text, MARKER, table(collect(results)))


def main(argv: list[str] | None = None) -> None:
    """Print the floors table and write it into BENCHMARKS.md."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=str(RESULTS))
    ap.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    args = ap.parse_args(argv)
    text = table(collect(Path(args.results)))
    print(text)
    out = Path(args.out)
    if out.exists():
        out.write_text(render(out.read_text(), Path(args.results)))
        print(f"updated {out}")


if __name__ == "__main__":
    main()
