"""Experiment reports: per-cell metrics from results.json, markdown tables, PNG figures, RESULTS.md blocks."""

from __future__ import annotations

import itertools
import json
import re
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sim.experiments.config import Cell, ExperimentConfig, expand, matches
from sim.experiments.runner import committed_cells, committed_match, normalised, start_prompt_sha

PERCENT = {
    "initial_accuracy",
    "final_accuracy",
    "initial_asr",
    "final_asr",
    "max_asr",
    "local_asr",
    "max_local_asr",
    "accuracy_drop",
}
LABELS = {
    "initial_accuracy": "ACC r0",
    "final_accuracy": "ACC",
    "initial_asr": "clean ASR",
    "final_asr": "ASR",
    "max_asr": "max ASR",
    "local_asr": "local ASR",
    "max_local_asr": "max local ASR",
    "epsilon": "ε / round",
    "epsilon_cumulative": "ε total",
    "rejected": "rejected/clipped",
    "wall_seconds": "wall s",
}


def cell_metrics(results: dict[str, Any]) -> dict[str, Any]:
    """The numbers a table can show, from one simulate results.json."""
    rounds = results.get("rounds") or []
    asrs = [r["asr"] for r in rounds if r.get("asr") is not None]
    local = [r["local_asr"] for r in rounds if r.get("local_asr") is not None]
    last = rounds[-1] if rounds else {}
    return {
        "initial_accuracy": results.get("initial_accuracy"),
        "final_accuracy": results.get("final_accuracy"),
        "initial_asr": results.get("initial_asr"),
        "final_asr": results.get("final_asr"),
        "max_asr": max(asrs) if asrs else None,
        "local_asr": sum(local) / len(local) if local else None,
        "max_local_asr": max(local) if local else None,
        "epsilon": last.get("epsilon"),
        "epsilon_cumulative": last.get("epsilon_cumulative"),
        "rejected": sum(len(r.get("notes") or {}) for r in rounds),
        "rounds": len(rounds),
        "wall_seconds": results.get("wall_seconds"),
    }


def collect(config: ExperimentConfig, out_root: Path) -> list[dict[str, Any]]:
    """One record per cell: params, metrics when the cell finished, its command and wall time."""
    records = []
    for cell in expand(config):
        folder = out_root / config.name / cell.id
        record: dict[str, Any] = {
            "cell": cell.id,
            "params": cell.params,
            "seed": cell.seed,
            "options": normalised(cell.options),
            "done": False,
        }
        results_path, meta_path = folder / "results.json", folder / "cell.json"
        if results_path.exists():
            results = json.loads(results_path.read_text())
            record |= {"done": True, "metrics": cell_metrics(results)}
            record["rounds"] = [
                {k: r.get(k) for k in ("round", "accuracy", "asr", "local_asr", "epsilon_cumulative")}
                for r in results.get("rounds", [])
            ]
        if meta_path.exists():
            meta = json.loads(meta_path.read_text())
            record["command"] = meta.get("command")
            record["wall_seconds"] = meta.get("wall_seconds")
            start = (meta.get("options") or {}).get("init_prompt")
            record["start_sha256"] = meta.get("start_sha256") or start_prompt_sha(start)
        records.append(record)
    return records


def merge_committed(
    config: ExperimentConfig,
    records: list[dict[str, Any]],
    committed: dict[str, dict[str, Any]],
    out_root: Path,
) -> list[dict[str, Any]]:
    """Cells not finished in the runs folder but finished in the committed summary (another machine,
    an earlier session) keep their committed record, unless this machine's starting prompt for the
    cell is known and is not the one the committed cell started from; a cell rerun here replaces it."""
    merged = []
    for cell, record in zip(expand(config), records, strict=True):
        previous = None if record["done"] else committed_match(committed, config, cell, out_root)
        merged.append({**previous, "options": record["options"]} if previous is not None else record)
    return merged


def _fmt(metric: str, value: Any) -> str:
    if value is None:
        return "–"
    if metric in PERCENT:
        return f"{100 * value:.1f}"
    if isinstance(value, float):
        return f"{value:.0f}" if metric == "wall_seconds" else f"{value:g}"
    return str(value)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def pivot(config: ExperimentConfig, records: list[dict[str, Any]]) -> str:
    """The markdown table of an experiment (seeds averaged; '–' where a cell has not run)."""
    spec = config.table
    cells = expand(config)
    keys = list(config.grid) or (list(cells[0].params) if cells else [])
    rows_keys = spec.rows or [k for k in keys if k not in spec.columns]

    def values(key: str) -> list[Any]:
        seen: list[Any] = []
        for c in cells:
            v = c.params.get(key, config.base.get(key))
            if v not in seen:
                seen.append(v)
        return seen

    row_combos = list(itertools.product(*(values(k) for k in rows_keys)))
    col_combos = list(itertools.product(*(values(k) for k in spec.columns))) or [()]
    header = [*rows_keys]
    for combo in col_combos:
        prefix = " ".join(f"{k}={v}" for k, v in zip(spec.columns, combo, strict=True))
        header += [f"{prefix} {LABELS.get(m, m)}".strip() for m in spec.metrics]
    with_paper = bool(config.paper or config.paper_note)
    if with_paper:
        header.append("paper")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    by_cell = {r["cell"]: r for r in records}
    for combo in row_combos:
        row_match = dict(zip(rows_keys, combo, strict=True))
        row = ["off" if v is None else str(v) for v in combo]
        any_cell = False
        for col in col_combos:
            match = row_match | dict(zip(spec.columns, col, strict=True))
            chosen = [c for c in cells if matches({**config.base, **c.params}, match)]
            if chosen:
                any_cell = True
            done = [by_cell[c.id] for c in chosen if by_cell.get(c.id, {}).get("done")]
            for m in spec.metrics:
                vals = [r["metrics"][m] for r in done if r["metrics"].get(m) is not None]
                row.append(_fmt(m, _mean(vals)) if vals else "–")
        if not any_cell:
            continue
        if with_paper:
            paper = [p.value for p in config.paper if matches({**config.base, **row_match}, p.match)]
            row.append(paper[0] if paper else config.paper_note)
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def command_of(config_path: Path) -> str:
    """The command that runs (or resumes) an experiment."""
    return f"fedprompt experiment run {shlex.quote(str(config_path))}"


def sizes(config: ExperimentConfig) -> str:
    """The shared simulate options, as the report states them."""
    parts = [f"{k}={v}" for k, v in config.base.items()]
    if config.warm_start:
        ws = config.warm_start
        parts.append(
            f"warm start: 1 client × {ws.steps} steps on a train subset of {ws.train_limit} (seed {ws.seed})"
        )
    return ", ".join(parts)


def section(
    config: ExperimentConfig, config_path: Path, records: list[dict[str, Any]], figures: list[str]
) -> str:
    """The generated markdown block of one experiment."""
    done = [r for r in records if r["done"]]
    wall = sum(r.get("wall_seconds") or 0.0 for r in done)
    status = (
        "**not run yet**"
        if not done
        else f"{len(done)} of {len(records)} cells run"
        + ("" if len(done) == len(records) else " (**incomplete**: rerun the command to finish)")
    )
    out = [
        f"### {config.title}",
        "",
        config.description.strip(),
        "",
        f"- Status: {status}" + (f"; wall time of the cells run: {wall / 60:.1f} min." if done else "."),
        *_clean_asr_line(done),
        f"- Command: `{command_of(config_path)}` then `fedprompt experiment report`.",
        f"- Sizes: {sizes(config)}; seeds {config.seeds}.",
        f"- Grid: {', '.join(f'{k} ∈ {v}' for k, v in config.grid.items()) or '—'}"
        + (f"; extra cells {config.extra_cells}" if config.extra_cells else "")
        + ".",
        "",
        pivot(config, records),
        "",
    ]
    out += [f"![{config.name}]({f})" for f in figures]
    return "\n".join(line for line in out if line is not None).replace("\n\n\n", "\n\n")


def _clean_asr_line(done: list[dict[str, Any]]) -> list[str]:
    """One line with the starting prompts' ASR and accuracy when every finished cell shares them (a warm
    start, or prompts of different lengths that happen to score alike)."""
    pairs = {(r["metrics"].get("initial_asr"), r["metrics"].get("initial_accuracy")) for r in done}
    if len(pairs) != 1:
        return []
    asr, acc = next(iter(pairs))
    if asr is None or acc is None:
        return []
    return [
        f"- Every cell's starting prompt (round 0) scores accuracy {100 * acc:.1f} %, clean ASR {100 * asr:.1f} %."
    ]


def _cell_for(config: ExperimentConfig, pattern: dict[str, Any]) -> Cell | None:
    for cell in expand(config):
        if matches({**config.base, **cell.params}, pattern):
            return cell
    return None


def figures(
    config: ExperimentConfig, out_root: Path, records: list[dict[str, Any]], fig_dir: Path
) -> list[Path]:
    """Render the config's plots from finished cells; returns the files written."""
    from sim.plots import plot_asr, plot_lines

    written: list[Path] = []
    fig_dir.mkdir(parents=True, exist_ok=True)
    for plot in config.plots:
        target = fig_dir / plot.file
        if plot.kind == "asr":
            cell = _cell_for(config, plot.cell)
            path = out_root / config.name / cell.id / "results.json" if cell else None
            if path is not None and path.exists():
                plot_asr(target, json.loads(path.read_text()))
            elif not target.exists():  # neither the cell nor a figure drawn from it on another machine
                continue
        else:
            series: dict[str, list[tuple[float, float]]] = {}
            for r in records:
                if not r["done"] or plot.x is None:
                    continue
                params = {**config.base, **r["params"]}
                value = r["metrics"].get(plot.y)
                if value is None:
                    continue
                label = f"{plot.series}={params.get(plot.series)}" if plot.series else plot.y
                scale = 100 if plot.y in PERCENT else 1
                series.setdefault(label, []).append((float(params[plot.x]), scale * value))
            if not series:
                continue
            ylabel = f"{LABELS.get(plot.y, plot.y)}" + (" (%)" if plot.y in PERCENT else "")
            plot_lines(target, plot.title or config.title, plot.x, ylabel, series)
        written.append(target)
    return written


def replace_block(text: str, name: str, body: str) -> str:
    """Replace (or append) the generated block of one experiment between its markers."""
    start, end = f"<!-- experiment:{name}:start -->", f"<!-- experiment:{name}:end -->"
    block = f"{start}\n{body.strip()}\n{end}"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.DOTALL)
    if pattern.search(text):
        return pattern.sub(lambda _: block, text)
    return text.rstrip() + "\n\n" + block + "\n"


def report(
    config_paths: Sequence[Path], out_root: Path, results_md: Path, fig_dir: Path, root: Path
) -> dict[str, list[dict[str, Any]]]:
    """Update RESULTS.md (generated blocks only), the figures and one summary JSON per experiment."""
    from sim.experiments.config import load_config

    text = results_md.read_text() if results_md.exists() else "# Results\n"
    summaries: dict[str, list[dict[str, Any]]] = {}
    for path in config_paths:
        config = load_config(path)
        fresh = collect(config, out_root)
        records = merge_committed(config, fresh, committed_cells(fig_dir, config.name), out_root)
        if any(r["done"] for r in fresh):  # something ran here: the summary takes it in, committed cells stay
            fig_dir.mkdir(parents=True, exist_ok=True)
            summary_path = fig_dir / f"{config.name}.json"
            summary_path.write_text(json.dumps({"experiment": config.name, "cells": records}, indent=2))
        pngs = figures(config, out_root, records, fig_dir)
        rel = [str(_relative(p, root)) for p in pngs]
        text = replace_block(text, config.name, section(config, _relative(path, root), records, rel))
        summaries[config.name] = records
    results_md.write_text(text)
    return summaries


def _relative(path: Path, root: Path) -> Path:
    try:
        return path.resolve().relative_to(root.resolve())
    except ValueError:
        return path
