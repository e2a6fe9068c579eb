"""Regenerate the tables of BENCHMARKS.md from bench/results/*.json (text outside the markers is kept).

    python -m bench.report [--results bench/results] [--out BENCHMARKS.md]

Each table sits between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``; a missing result file
leaves its table as it was.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import floors
from bench.common import RESULTS, ROOT, replace_block


def _f(x: Any, fmt: str = "{:.2f}") -> str:
    return "–" if x is None else fmt.format(x)


def _ms(x: Any) -> str:
    if x is None:
        return "–"
    return f"{x * 1e3:.2f} ms" if x < 0.01 else f"{x * 1e3:.0f} ms" if x < 10 else f"{x:.1f} s"


def _machine(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    load = ", ".join(f"{v:.1f}" for v in m["loadavg"])
    return (
        f"*`{doc['command']}` — {doc['finished_at']}, {m['cpus']} × {m['cpu_model']}, {m['memory_gib']} GiB, "
        f"commit {m['commit']}, load average at the end {load} (1/5/15 min).*"
    )


def comm_table(doc: dict[str, Any]) -> str:
    """Bytes per client per round by method and model."""
    lines = [
        "| model | method | tensors (float32) | on the wire per round (up + down) | of which headers "
        "| ÷ (raw tensors + headers) | safetensors ÷ raw | ÷ full fine-tuning round |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        full = r.get("full_finetuning")
        lines.append(
            f"| {r['model']} | {r['method']} | {r['tensor_bytes']:,} B | {r['wire_total']:,} B "
            f"({r['wire_up']:,} + {r['wire_down']:,}) | {r['header_bytes']:,} B "
            f"| **{r['ratio_to_raw_plus_headers']:.4f}×** | {r['safetensors_overhead']:.4f}× "
            f"| {_f(r.get('ratio_to_full_finetuning'), '{:.2e}')}"
            + (f" (of {full['round_bytes'] / 2**20:,.1f} MiB)" if full else "")
            + " |"
        )
    idle = doc["rows"][0]["idle_poll_bytes"] if doc["rows"] else None
    return (
        "\n".join(lines)
        + f"\n\nAn empty long-poll answer (204) costs {idle} bytes on the wire.\n\n"
        + _machine(doc)
    )


def aggregation_table(doc: dict[str, Any]) -> str:
    """Seconds and peak memory of each rule as ratios to numpy.average."""
    rules = sorted({n for r in doc["results"] for n in r["rules"]})
    head = "| K | numpy.average | " + " | ".join(rules) + " | coordinator round (FedAvg, SQLite) |"
    lines = [head, "|" + "---|" * (len(rules) + 3)]
    for r in doc["results"]:
        cells = []
        for n in rules:
            row = r["rules"].get(n, {})
            if "skipped" in row:
                cells.append("skipped")
            elif row:
                cells.append(f"{row['time_ratio']:.2f}× / {row['peak_ratio']:.2f}×")
            else:
                cells.append("–")
        svc = r["service_fedavg"]
        lines.append(
            f"| {r['k']:,} | {_ms(r['numpy']['seconds'])}, {r['numpy']['peak_mib']:.1f} MiB | "
            + " | ".join(cells)
            + f" | {svc['time_ratio']:.2f}× / {svc['peak_ratio']:.2f}× ({_ms(svc['seconds'])}) |"
        )
    return (
        "\n".join(lines)
        + "\n\nCells: time ÷ numpy time / peak memory ÷ numpy peak memory.\n\n"
        + _machine(doc)
    )


def worker_table(doc: dict[str, Any]) -> str:
    """Engine vs bare loop."""
    pairs = doc.get("paired_ratios")
    return (
        "| engine steps/s | bare torch loop steps/s | ratio (median of pairs) | pairs (bare s ÷ engine s) |\n"
        "|---|---|---|---|\n"
        f"| {doc['engine_steps_per_s']:.3f} | {doc['bare_steps_per_s']:.3f} | **{doc['ratio']:.3f}×** | "
        f"{', '.join(f'{x:.3f}' for x in pairs) if pairs else '–'} |\n\n"
        f"batch {doc['batch_size']}, max length {doc['max_length']}, {doc['steps_per_block']} steps per block, "
        f"{doc['threads']} torch threads, {doc['dataset']}.\n\n" + _grouping(doc) + _machine(doc)
    )


def _grouping(doc: dict[str, Any]) -> str:
    """The engine as it trains by default (examples of similar length batched together) against the
    same engine on the random batches, when the run measured it."""
    if "length_grouping_speedup" not in doc:
        return ""
    pairs = ", ".join(f"{x:.3f}" for x in doc["paired_grouping_ratios"])
    return (
        f"Length grouping (windows of {doc['length_window']} batches sorted by length, the engine's "
        f"default): {doc['grouped_steps_per_s']:.3f} steps/s, **{doc['length_grouping_speedup']:.3f}×** "
        f"the same engine on the random batches (median of the blocks' ratios: {pairs}); real tokens are "
        f"{doc['real_token_share_grouped']:.0%} of a grouped batch's positions, "
        f"{doc['real_token_share_random']:.0%} of a random one's.\n\n"
    )


LEVER_ROWS = [
    ("bf16", "bf16 autocast (`torch.autocast('cpu', torch.bfloat16)`)", "float32", "per example"),
    ("one_thread", "1 torch thread", "2 threads, same steps", "per example"),
    (
        "processes",
        "2 processes × 1 thread, training at once",
        "1 process × 2 threads, one after another",
        "per step",
    ),
    ("batched_clients", "one step of batch 32 (two clients stacked)", "two steps of batch 16", "per example"),
]


def levers_table(doc: dict[str, Any]) -> str:
    """Each lever against the default path: seconds per unit, ratio (default ÷ lever), spread."""
    lines = [
        "| lever | baseline (same pairs) | lever s | baseline s | ratio (baseline ÷ lever, median) "
        "| spread (min–max) | pairs |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, lever, baseline, unit in LEVER_ROWS:
        row = doc["levers"].get(key)
        if row is None:
            continue
        lines.append(
            f"| {lever} | {baseline} | {row['lever_seconds_median']:.4f} {unit} "
            f"| {row['default_seconds_median']:.4f} {unit} | **{row['ratio']:.2f}×** "
            f"| {row['ratio_min']:.2f}×–{row['ratio_max']:.2f}× | {len(row['paired_ratios'])} |"
        )
    flags = doc.get("cpu_flags") or {}
    native = [name for name, present in flags.items() if present and "bf16" in name]
    acc = doc.get("accuracy") or {}
    if acc:
        check = ", ".join(f"{k} {v * 100:.1f} %" for k, v in acc.items())
        after = f"Test accuracy after {doc['accuracy_steps']} steps from the same prompt: {check}."
    else:
        after = f"No accuracy check ({doc.get('accuracy_skipped') or 'not run'})."
    return (
        "\n".join(lines)
        + f"\n\n{doc['model']} on {doc['dataset']}, {doc['scoring'].split(':')[0]} scoring, batch {doc['batch_size']}, "
        f"max length {doc['max_length']}, {doc['steps_per_block']} steps per block. CPU bf16 instructions: "
        f"{', '.join(native) if native else 'none (no AVX512-BF16 or AMX-BF16)'}. {after}\n\n" + _machine(doc)
    )


def _mid(cell: dict[str, Any], fmt: Callable[[Any], str]) -> str:
    """A figure over the repeats: median (min–max)."""
    if not cell or cell.get("median") is None:
        return "–"
    if cell["n"] == 1 or fmt(cell["min"]) == fmt(cell["max"]):
        return fmt(cell["median"])
    return f"{fmt(cell['median'])} ({fmt(cell['min'])}–{fmt(cell['max'])})"


def _x(digits: int = 2) -> Callable[[Any], str]:
    return lambda v: f"{v:.{digits}f}×"


def _num(fmt: str) -> Callable[[Any], str]:
    return lambda v: fmt.format(v)


def ingest_repeats_table(doc: dict[str, Any]) -> str:
    """Per grid point and system: medians over the repeats with their spread, the coordinator's
    ratios to the null app of the same repeat, the generator's limits and the load."""
    lines = [
        "| K | C | prompt | system | runs | errors | CPU per request | rounds/min | upload p50 | upload p99 "
        "| ÷ null p99 (same repeat) | train-task delivery p99 | ÷ null | ÷ previous build (same repeat): CPU per "
        "request / delivery p99 / rounds per min | uploads/s | server CPU s | peak RSS "
        "| generator CPU s / loop lag p99 / ramp | load (1 min) start–end |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in doc["points"]:
        for name, cell in p["summary"].items():
            v = cell.get("vs_null", {})
            b = cell.get("vs_previous", {})
            loads = cell["loadavg_start"]["values"] + cell["loadavg_end"]["values"]
            load = f"{min(loads):.1f}–{max(loads):.1f}" if loads else "–"
            previous = (
                f"{_mid(b.get('cpu_ms_per_request', {}), _x())} / {_mid(b.get('train_delivery_p99', {}), _x())} "
                f"/ {_mid(b.get('rounds_per_min', {}), _x())}"
                if b
                else "–"
            )
            label = "null app" if name == "null" else name.replace("@previous", " (previous build)")
            lines.append(
                f"| {p['k']:,} | {p['c']} | 20×{p['hidden']} | {label} "
                f"| {cell['upload_p99']['n']} | **{int(sum(cell['errors']['values']))}** "
                f"| {_mid(cell.get('cpu_ms_per_request', {}), _num('{:.2f} ms'))} "
                f"| {_mid(cell['rounds_per_min'], _num('{:.1f}'))} "
                f"| {_mid(cell['upload_p50'], _ms)} | {_mid(cell['upload_p99'], _ms)} "
                f"| {_mid(v.get('upload_p99', {}), _x())} | {_mid(cell['train_delivery_p99'], _ms)} "
                f"| {_mid(v.get('train_delivery_p99', {}), _x())} | {previous} "
                f"| {_mid(cell['uploads_per_s'], _num('{:.0f}'))} "
                f"| {_mid(cell['cpu_s'], _num('{:.1f}'))} | {_mid(cell['peak_rss_mib'], _num('{:.0f} MiB'))} "
                f"| {_mid(cell['generator_cpu_s'], _num('{:.1f}'))} / {_mid(cell['generator_lag_p99'], _ms)} "
                f"/ {_mid(cell['generator_ramp_s'], _ms)} | {load} |"
            )
    s = doc["settings"]
    lines += [
        "",
        "Cells: median over the repeats (min–max). The order of the systems rotates from repeat to repeat; "
        "each ratio is to the null app, or to the previous build's coordinator on the same backend, of the "
        "same repeat. CPU per request: the coordinator's CPU seconds over the run ÷ the requests it answered.",
        "",
        f"{s['rounds']} rounds per federation; each simulated worker trains for a random 0–{s['train_s']} s; "
        f"long-poll wait {s['wait']} s; {s['repeats']} repeats.",
        "",
        _machine(doc),
    ]
    return "\n".join(lines)


def ingest_table(doc: dict[str, Any]) -> str:
    """Coordinator rows with their ratios to the null app."""
    if "points" in doc:
        return ingest_repeats_table(doc)
    lines = [
        "| backend | K | C | prompt | uploads | uploads/s (÷ null) | upload p50 / p99 (÷ null p99) "
        "| poll delivery p50 / p99 | download p99 | errors | CPU s (per upload ÷ null) | peak RSS (÷ null) | rounds/min |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        v = r["vs_null"]
        lines.append(
            f"| {r['backend']} | {r['k']:,} | {r['c']} | {r['prompt'][0]}×{r['prompt'][1]} | {r['uploads']:,} "
            f"| {_f(r['uploads_per_s'], '{:.0f}')} ({_f(v['uploads_per_s'])}×) "
            f"| {_ms(r['upload_s']['p50'])} / {_ms(r['upload_s']['p99'])} ({_f(v['upload_p99'])}×) "
            f"| {_ms(r['poll_delivery_s']['p50'])} / {_ms(r['poll_delivery_s']['p99'])} "
            f"| {_ms(r['download_s']['p99'])} | **{r['errors']}** "
            f"| {r['coordinator_cpu_s']:.0f} ({_f(v['cpu_per_upload'], '{:.0f}')}×) "
            f"| {r['coordinator_peak_rss_mib']:.0f} MiB ({_f(v['peak_rss'])}×) | {_f(r['rounds_per_min'], '{:.1f}')} |"
        )
    lines += ["", "Null app (same load generator, same K, pacing and rounds):", ""]
    lines += [
        "| K | prompt | uploads | uploads/s | upload p50 / p99 | CPU s | peak RSS | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n in doc["null"]:
        lines.append(
            f"| {n['k']:,} | 20×{n['hidden']} | {n['uploads']:,} | {_f(n['uploads_per_s'], '{:.0f}')} "
            f"| {_ms(n['upload_s']['p50'])} / {_ms(n['upload_s']['p99'])} | {n['cpu_s']:.1f} | {n['peak_rss_mib']:.0f} MiB | {n['errors']} |"
        )
    s = doc["settings"]
    lines += [
        "",
        f"{s['rounds']} rounds per federation; each simulated worker trains for a random {0}–{s['train_s']} s; "
        f"long-poll wait {s['wait']} s.",
        "",
        _machine(doc),
    ]
    return "\n".join(lines)


def e2e_table(doc: dict[str, Any]) -> str:
    """Share of the round wall time per part."""
    shares = doc["share_of_round"]
    lines = ["| " + " | ".join(shares) + " |", "|" + "---|" * len(shares)]
    lines.append(
        "| " + " | ".join(_f(v * 100 if v is not None else None, "{:.1f} %") for v in shares.values()) + " |"
    )
    lines += [
        "",
        "| round | wall | participants | " + " | ".join(doc["rounds"][0]["mean_s"]) + " |"
        if doc["rounds"]
        else "",
        "|" + "---|" * (3 + len(doc["rounds"][0]["mean_s"])) if doc["rounds"] else "",
    ]
    for r in doc["rounds"]:
        lines.append(
            f"| {r['round']} | {r['wall_s']:.1f} s | {r['participants']} | "
            + " | ".join(f"{v:.2f} s" for v in r["mean_s"].values())
            + " |"
        )
    lines += [
        "",
        f"`fedprompt {doc['simulate_command']}`: {doc['simulate_wall_s']:.0f} s in all, "
        f"{doc['rounds_wall_s']:.0f} s of it inside rounds (the rest: start-up, model loading, the final evaluation).",
    ]
    repeats = doc.get("repeats") or []
    if repeats:
        lines += [
            "",
            f"Baseline: `fedprompt-worker {repeats[0]['train-local']['command']}`, the same training steps in one process.",
            "",
            "| repeat | order | simulate wall | train-local wall | ÷ (whole run) | rounds | train-local training | ÷ (rounds ÷ training) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in repeats:
            sim, base, v = r["simulate"], r["train-local"], r["vs_train_local"]
            lines.append(
                f"| {r['repeat'] + 1} | {', '.join(r['order'])} | {sim['simulate_wall_s']:.1f} s | {base['wall_s']:.1f} s "
                f"| **{_f(v['wall'])}×** | {sim['rounds_wall_s']:.1f} s | {_f(base['train_s'], '{:.1f} s')} "
                f"| {_f(v['rounds_vs_training'])}× |"
            )
    lines += ["", _machine(doc)]
    return "\n".join(lines)


def peers_table(doc: dict[str, Any]) -> str:
    """fedprompt beside Flower: medians (min–max) over the repeats and fedprompt ÷ Flower per repeat."""
    s, sm = doc["settings"], doc["summary"]
    rows = (
        ("wall time, start-up included", "wall_s", _num("{:.0f} s")),
        ("the federation (each's own clock)", "federation_s", _num("{:.0f} s")),
        ("overhead per round beyond training", "overhead_per_round_s", _num("{:.1f} s")),
        ("peak memory, all processes (PSS)", "peak_pss_mib", _num("{:,.0f} MiB")),
        ("peak memory, all processes (RSS summed)", "peak_rss_sum_mib", _num("{:,.0f} MiB")),
        ("final accuracy", "final_accuracy", lambda v: f"{100 * v:.1f} %"),
    )
    lines = [
        "| figure | fedprompt | Flower | fedprompt ÷ Flower (per repeat) |",
        "|---|---|---|---|",
    ]
    for label, key, fmt in rows:
        cell = sm[key]
        lines.append(
            f"| {label} | {_mid(cell['fedprompt'], fmt)} | {_mid(cell['flower'], fmt)} | {_mid(cell['ratio'], _x())} |"
        )
    lines += [
        "",
        f"{s['dataset']}, K = {s['clients']} clients, C = {s['fraction']}, {s['rounds']} rounds × {s['local_steps']} "
        f"local steps of batch {s['batch_size']}, {s['train_limit']:,} training examples, {s['eval_limit']} test "
        f"examples, {s['slots']} clients training at once; "
        + (f"seeds 0–{s['repeats'] - 1}, one repeat each" if s["repeats"] > 1 else "seed 0, one repeat")
        + f", fedprompt first. flwr {doc['flwr']}, Ray {doc['ray']}. The same clients every round in both: "
        f"{'yes' if sm['same_clients'] else '**no**'}; largest accuracy difference in any round: "
        f"{sm['max_accuracy_gap_points']:.2f} points.",
        "",
        _machine(doc),
    ]
    return "\n".join(lines)


def async_table(doc: dict[str, Any]) -> str:
    """Mode async against rounds per seed: time to the target, accuracy at the budget, the ratios."""
    s, target = doc["settings"], doc["target_accuracy"]

    def secs(v: float | None) -> str:
        return "not reached" if v is None else f"{v:.0f} s"

    def times(v: float | None) -> str:
        return "–" if v is None else f"{v:.2f}×"

    lines = [
        f"| seed | rounds: time to {100 * target:.0f} % | async: time to {100 * target:.0f} % | async ÷ rounds "
        "| budget (the faster mode's last version) | rounds: accuracy at the budget | async: accuracy at the budget "
        "| async ÷ rounds, all versions |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in doc["pairs"]:
        lines.append(
            f"| {p['seed']} | {secs(p['time_to_target_sync_s'])} | {secs(p['time_to_target_async_s'])} "
            f"| {times(p['time_to_target_ratio'])} | {p['budget_s']:.0f} s | {100 * p['accuracy_at_budget_sync']:.1f} % "
            f"| {100 * p['accuracy_at_budget_async']:.1f} % | {times(p['federation_ratio'])} |"
        )
    lines += [
        "",
        "| accuracy | rounds reach it (seeds) | async reaches it (seeds) | rounds: time, per seed | async: time, per seed "
        "| async ÷ rounds, per seed |",
        "|---|---|---|---|---|---|",
    ]
    for i, x in enumerate(doc.get("targets", [])):
        steps = [p["ladder"][i] for p in doc["pairs"]]
        lines.append(
            f"| {100 * x:.0f} % | {sum(s['sync_s'] is not None for s in steps)} of {len(steps)} "
            f"| {sum(s['async_s'] is not None for s in steps)} of {len(steps)} "
            f"| {', '.join(secs(s['sync_s']) for s in steps)} | {', '.join(secs(s['async_s']) for s in steps)} "
            f"| {', '.join(times(s['ratio']) for s in steps)} |"
        )
    runs = doc["runs"]
    sync = next(r for r in runs if r["mode"] == "sync")
    asy = next(r for r in runs if r["mode"] == "async")
    staleness = [
        r["mean_staleness"] for r in runs if r["mode"] == "async" and r["mean_staleness"] is not None
    ]
    lines += [
        "",
        f"{s['dataset']}, K = {s['clients']} clients, {s['local_steps']} local steps of batch 16 per update, "
        f"{s['train_limit']:,} training examples, {s['eval_limit']} test examples (evaluated by {s['evaluators']} "
        f"clients); client speeds `{s['client_speed']}`. Rounds: C = {sync['spec']['fraction']}, "
        f"{sync['spec']['rounds']} rounds. Mode async: concurrency {asy['spec']['concurrency']}, buffer "
        f"{asy['spec']['buffer_size']}, {asy['spec']['rounds']} versions; the same {sync['updates']} updates in "
        f"all; mean staleness of the counted updates "
        + ", ".join(f"{v:.2f}" for v in staleness)
        + " by seed. The two alternate in order from seed to seed. Curves: "
        f"[{Path(doc['plot']).name}](bench/results/{Path(doc['plot']).name}).",
        "",
        _machine(doc.get("runs_from") or doc),
    ]
    return "\n".join(lines)


def scale_table(doc: dict[str, Any]) -> str:
    """Each repeat's federation wall time per K and the larger K's ratio to the first."""
    sizes, st = doc["sizes"], doc["settings"]
    head = " | ".join(f"K = {z['clients']}, C = {z['fraction']}" for z in sizes)
    ratios = " | ".join(f"K = {z['clients']} ÷ K = {sizes[0]['clients']}" for z in sizes[1:])
    lines = [f"| repeat | order | {head} | {ratios} |", "|---|---|" + "---|" * (2 * len(sizes) - 1)]
    for r in doc["repeats"]:
        cells = " | ".join(
            f"{run['federation_s']:.1f} s ({100 * run['final_accuracy']:.1f} %, {run['peak_rss_mib']:,.0f} MiB)"
            for run in r["runs"]
        )
        ratio_cells = " | ".join(f"**{_f(r['ratios'][str(z['clients'])], '{:.3f}')}×**" for z in sizes[1:])
        lines.append(
            f"| {r['repeat'] + 1} | {', '.join(f'K = {k}' for k in r['order'])} | {cells} | {ratio_cells} |"
        )
    evaluators = "every client evaluating" if st["evaluators"] is None else f"{st['evaluators']} evaluators"
    lines += [
        "",
        f"sst2, partition {st['partition']}, {st['rounds']} rounds × {st['local_steps']} local steps, label words "
        f"`{st['verbalizer']}`, seed {st['seed']}, 2 training pool processes, {evaluators}. Each cell: the "
        "federation's wall time (`results.json` `wall_seconds`), its final accuracy and the peak resident memory "
        "of all its processes.",
        "",
        _machine(doc),
    ]
    return "\n".join(lines)


def suite_table(doc: dict[str, Any]) -> str:
    """Each run of the suite: what ran beside it, its wall time, pytest's counts, and the goals met or not."""
    goal = doc["settings"]["idle_goal_s"]
    lines = [
        "| run | beside it | wall time | pytest's own | passed | failed | errors | skipped | load (1 min) | goal |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in doc["runs"]:
        busy = run["busy_processes"]
        beside = "nothing (idle)" if busy == 0 else f"{busy} busy processes (`while True: pass`)"
        clean = run["returncode"] == 0 and run["failed"] == 0 and run["errors"] == 0
        if busy == 0:
            goal_text = f"≤ {goal:.0f} s and 0 failures: " + (
                "met" if clean and run["wall_s"] <= goal else "not met"
            )
        else:
            goal_text = "0 failures: " + ("met" if clean else "not met")
        pytest_s = "–" if run["pytest_s"] is None else f"{run['pytest_s']:.0f} s"
        load = f"{run['loadavg_start'][0]:.1f} → {run['loadavg_end'][0]:.1f}"
        lines.append(
            f"| {'idle' if busy == 0 else 'loaded'} | {beside} | **{run['wall_s']:.0f} s** | {pytest_s} | "
            f"{run['passed']} | {run['failed']} | {run['errors']} | {run['skipped']} | {load} | {goal_text} |"
        )
    lines += [
        "",
        f"`{doc['settings']['command']}` from the repository root, one run of each, one after the other; "
        "wall time is the whole command's (lint, type check and the suite), pytest's own is its summary line.",
        "",
        _machine(doc),
    ]
    return "\n".join(lines)


TABLES: dict[str, tuple[str, Callable[[dict[str, Any]], str]]] = {
    "comm": ("comm.json", comm_table),
    "aggregation": ("aggregation.json", aggregation_table),
    "worker": ("worker.json", worker_table),
    "levers": ("levers.json", levers_table),
    "levers-amx": ("levers-amx.json", levers_table),
    "ingest": ("ingest.json", ingest_table),
    "ingest_board_learns": ("ingest-board-learns.json", ingest_table),
    "ingest_batched_polls": ("ingest-batched-polls.json", ingest_table),
    "ingest_fast_paths": ("ingest-fast-paths.json", ingest_table),
    "ingest_enrol_batches": ("ingest-enrol-batches.json", ingest_table),
    "ingest_k10000": ("ingest-k10000.json", ingest_table),
    "ingest_k10000_enrol_batches": ("ingest-k10000-enrol-batches.json", ingest_table),
    "e2e": ("e2e.json", e2e_table),
    "peers": ("peers.json", peers_table),
    "peers_k1000": ("peers-k1000.json", peers_table),
    "async": ("async.json", async_table),
    "scale": ("scale.json", scale_table),
    "scale_evaluators": ("scale-evaluators.json", scale_table),
    "suite": ("suite.json", suite_table),
}


def render(text: str, results: Path) -> str:
    """Replace every marked table whose result file exists, and the floors table."""
    for name, (file, fn) in TABLES.items():
        path = results / file
        if path.exists():
            text = replace_block(text, name, fn(json.loads(path.read_text())))
    return floors.render(text, results)


def main(argv: list[str] | None = None) -> None:
    """Rewrite the tables in BENCHMARKS.md."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--results", default=str(RESULTS))
    ap.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.write_text(render(out.read_text(), Path(args.results)))
    print(f"updated {out}")


if __name__ == "__main__":
    main()
