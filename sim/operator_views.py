"""What the operator CLI shows: tables of federations and rounds, one line of a federation's or a
round's progress, and the progress bar of the wait commands (on stderr: stdout stays clean for --json)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

console = Console()
err = Console(stderr=True)


def show(table: Table) -> None:
    """A table on stdout: framed to the terminal's width on a terminal; elsewhere (a pipe, a file) in
    plain ASCII and as wide as its cells, so no cell is cut ("attem…") nor folded."""
    if console.is_terminal:
        console.print(table)
        return
    table.box = box.ASCII
    wide = Measurement.get(console, console.options.update_width(100_000), table).maximum
    Console(width=max(wide, 20)).print(table, crop=False)


def fmt(v: Any, digits: int = 4) -> str:
    """A value for a table cell: '-' for None, floats with `digits` decimals."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def status_table(feds: list[dict[str, Any]]) -> None:
    """Federations: state, round, uploads of the open round, clients, latest version and its accuracy."""
    table = Table(title="federations")
    for col in ("id", "name", "state", "round", "uploads", "clients", "latest version", "accuracy"):
        table.add_column(col)
    for f in feds:
        latest = (f.get("latest") or {}).get("evaluation") or {}
        open_round = f.get("open_round")
        uploads = "{}/{}".format(*upload_counts(open_round)) if open_round else "-"
        table.add_row(
            str(f["id"]),
            f["name"],
            f["state"] + (" (paused)" if f["paused"] and f["state"] != "paused" else ""),
            f"{f['current_round']}/{f['rounds_total']}",
            uploads,
            f"{f['clients']['available']}/{f['clients']['enrolled']}",
            str(f["latest_version"]),
            fmt(latest.get("accuracy")),
        )
    show(table)


def rounds_table(rounds: list[dict[str, Any]]) -> None:
    """A round history, one row per attempt."""
    table = Table(title="rounds")
    for col in (
        "round",
        "attempt",
        "state",
        "participants",
        "uploaded",
        "accuracy",
        "train loss",
        "bytes up",
        "s",
    ):
        table.add_column(col)
    for r in rounds:
        ev = r.get("evaluation") or {}
        table.add_row(
            str(r["round"]),
            str(r["attempt"]),
            r["state"],
            str(len(r["participants"])),
            str(sum(p["uploaded"] for p in r["participants"])),
            fmt(ev.get("accuracy")),
            fmt(r["stats"].get("train_loss")),
            fmt(r["stats"].get("bytes_up")),
            fmt(r.get("seconds"), 1),
        )
    show(table)


def latest_attempt(rounds: list[dict[str, Any]], number: int) -> dict[str, Any] | None:
    """The newest attempt of round `number` in a round history, or None if it never opened."""
    attempts = [r for r in rounds if r["round"] == number]
    return max(attempts, key=lambda r: r["attempt"]) if attempts else None


def upload_counts(rnd: dict[str, Any]) -> tuple[int, int]:
    """(uploaded, selected) participants of a round attempt."""
    return sum(1 for p in rnd["participants"] if p["uploaded"]), len(rnd["participants"])


def deadline_text(rnd: dict[str, Any], now: float) -> str:
    """'deadline in 42 s' for an open attempt; '' otherwise."""
    if rnd["state"] != "open":
        return ""
    left = rnd["deadline_at"] - now
    return f"deadline in {left:.0f} s" if left >= 0 else f"deadline passed {-left:.0f} s ago"


def federation_line(fed: dict[str, Any]) -> str:
    """One line about a federation's progress: name, state, open round and its uploads."""
    line = f"{fed['name']}: {fed['state']}"
    open_round = fed.get("open_round")
    if open_round:
        uploaded, selected = upload_counts(open_round)
        line += f", round {open_round['round']} {uploaded}/{selected} uploaded"
    return line


@contextmanager
def progress_bar(disabled: bool) -> Iterator[Progress]:
    """A progress bar on stderr (stdout stays clean for --json)."""
    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[left]}"),
        TimeElapsedColumn(),
        console=err,
        disable=disabled,
    )
    with progress:
        yield progress
