"""What `fedprompt simulate` prints: the console, one table row per closed round, the closing summary."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

# Written to a log (make demo's pipe, an experiment cell's simulate.log) the round table keeps its columns
# whole instead of folding them into 80 characters; $COLUMNS still wins where it is set.
console = Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 160)

COLUMNS = [
    ("round", 5),
    ("clients", 7),
    ("accuracy %", 10),
    ("macro-F1 %", 10),
    ("per class %", 13),
    ("train loss", 10),
    ("up", 10),
    ("down", 10),
    ("s", 6),
    ("ASR %", 6),
    ("local ASR %", 11),
    ("local ACC %", 11),
    ("ε total", 8),
    ("params/client (of model)", 24),
]


def fmt(v: Any, pct: bool = False) -> str:
    """A number for a table: '-' for None, a percentage with one decimal, or four decimals."""
    if v is None:
        return "-"
    return f"{100 * v:.1f}" if pct else (f"{v:.4f}" if isinstance(v, float) else str(v))


ASR_COLUMNS = ("ASR %", "local ASR %", "local ACC %")


def has_asr(record: dict[str, Any]) -> bool:
    """Whether a round record carries an ASR (global or a malicious client's local one)."""
    return record.get("asr") is not None or record.get("local_asr") is not None


def row_table(record: dict[str, Any], header: bool, asr: bool | None = None) -> Table:
    """One round record as a one-row table (with the column names above it when `header`). The ASR
    columns only when `asr` (default: when the record has one): a federation without a backdoor
    (and without --measure-asr) measures none, and a column of dashes would read as an attack."""
    asr = has_asr(record) if asr is None else asr
    table = Table(show_header=header, box=None, pad_edge=False)
    for col, width in COLUMNS:
        if asr or col not in ASR_COLUMNS:
            table.add_column(col, width=width, justify="right")
    eps = record.get("epsilon_cumulative")
    cells = [
        str(record["round"]),
        str(record["participants"]),
        fmt(record["accuracy"], pct=True),
        fmt(record.get("macro_f1"), pct=True),
        per_class_text(record.get("per_class_accuracy")),
        fmt(record["loss"]),
        f"{record['bytes_up'] / 1024:.1f} KiB",
        f"{record['bytes_down'] / 1024:.1f} KiB",
        f"{record['seconds']:.1f}" if record["seconds"] is not None else "-",
        *([fmt(record.get(k), pct=True) for k in ("asr", "local_asr", "local_accuracy")] if asr else []),
        f"{eps:g}" if eps is not None else "-",
        params_text(record),
    ]
    table.add_row(*cells)
    return table


def per_class_text(values: list[float | None] | None) -> str:
    """Per-class accuracy in label id order, e.g. '91.2/40.0' ('-' when the evaluations carry none)."""
    return "/".join(fmt(v, pct=True) for v in values) if values else "-"


def params_text(record: dict[str, Any]) -> str:
    """Parameters each client sent this round, and their share of the whole model."""
    sent, ratio = record.get("params_communicated"), record.get("comm_ratio")
    if not sent:
        return "-"
    return f"{sent:,}" + (f" ({100 * ratio:.4f} %)" if ratio is not None else "")


def print_summary(results: dict[str, Any], out: Path) -> None:
    """The closing lines: final accuracy and traffic, the baseline and the ASR if any, the files."""
    console.print(
        f"[bold green]done[/] in {results['wall_seconds']:.0f}s (the federation): final accuracy "
        f"{fmt(results['final_accuracy'], pct=True)} % (initial {fmt(results['initial_accuracy'], pct=True)} %), "
        f"{results['total_bytes_up'] / 1024:.0f} KiB up, {results['total_bytes_down'] / 1024:.0f} KiB down"
    )
    last = (results.get("rounds") or [{}])[-1]
    if last.get("per_class_accuracy"):
        labels = results.get("labels") or [str(i) for i in range(len(last["per_class_accuracy"]))]
        per_class = ", ".join(
            f"{name} {fmt(v, pct=True)} %"
            for name, v in zip(labels, last["per_class_accuracy"], strict=False)
        )
        console.print(f"final macro-F1 {fmt(last.get('macro_f1'), pct=True)} %; per class: {per_class}")
        if last.get("collapsed"):
            console.print(
                "[bold yellow]warning:[/] the final prompt predicts one class for (nearly) every example: "
                "a constant predictor, whatever its accuracy. Label skew drove it there; see "
                "docs/label-skew.md (drift correction, more clients per round, fewer local steps).",
                soft_wrap=True,
            )
    if results.get("best_version") is not None:
        console.print(
            f"best version {results['best_version']}: accuracy {fmt(results['best_accuracy'], pct=True)} %, "
            f"macro-F1 {fmt(results.get('best_macro_f1'), pct=True)} % (by macro-F1 on the clients' "
            "evaluation shares, never a collapsed version; `fedprompt prompt get` hands it out by default)",
            soft_wrap=True,
        )
    base = results.get("baseline")
    if base:
        took = f" in {base['seconds']:.0f}s" if base.get("seconds") is not None else ""
        if base.get("status", "complete") == "complete":
            console.print(f"centralised baseline: {fmt(base['accuracy'], pct=True)} %{took}")
        else:
            last = base.get("last_evaluation") or {}
            seen = (
                f"; last measured {fmt(last.get('accuracy'), pct=True)} % at step {last['step']}"
                if last
                else ""
            )
            console.print(
                f"[yellow]centralised baseline: partial[/] ({base.get('interrupted')}{took}, "
                f"{base.get('steps_done') or 0} of {base['steps']} steps{seen})",
                soft_wrap=True,
            )
    if results.get("status") == "partial":
        console.print(
            f"[yellow]results labelled partial:[/] {results.get('interrupted')} was interrupted",
            soft_wrap=True,
        )
    if results.get("final_asr") is not None:
        console.print(
            f"attack success rate: {fmt(results['final_asr'], pct=True)} % "
            f"(clean, initial prompt: {fmt(results['initial_asr'], pct=True)} %)"
        )
    console.print(f"results: {out / 'results.json'}, {out / 'rounds.csv'}, {out / 'accuracy.png'}")
