"""Following a simulated federation: a progress bar of the open round, a table row per closed round."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fedprompt.shared.client import ApiError, CoordinatorClient
from fedprompt.shared.vocab import FederationState
from fedprompt.sim.results import attach_sites, initial_record, round_records
from fedprompt.sim.supervisor import Processes
from fedprompt.sim.tables import console, has_asr, row_table
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

# How long a closed round's row waits for every active client's evaluation before it is printed anyway.
EVAL_GRACE_S = 300.0
# Without a terminal (a log, CI): how often the training clients' steps are read from their heartbeats.
STEPS_EVERY_S = 30.0


def training_line(clients: list[dict[str, Any]], number: int) -> str | None:
    """The selected clients' local steps in round `number`, as their last heartbeats told them (one
    plain line for a log), or None when none has said it trains in that round."""
    steps = total = training = 0
    for client in clients:
        said = client.get("activity") or {}
        if said.get("phase") != "training" or said.get("round") != number or not said.get("total_steps"):
            continue  # another round's, or sent before its local steps were counted
        training += 1
        steps += int(said.get("step") or 0)
        total += int(said["total_steps"])
    if not training:
        return None
    return f"round {number}: {training} client{'s' if training > 1 else ''} training, local steps {steps}/{total}"


def follow(
    admin: CoordinatorClient, fid: int, spec: dict[str, Any], clients: int, procs: Processes
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Show progress until every round is closed and evaluated; return the round records and the
    initial prompt's evaluation. Each record gets the resident memory of all processes when its round
    was first seen closed (`rss_bytes`) and the peak until then (`peak_rss_bytes`), so growth over
    rounds shows."""
    total_rounds = int(spec["rounds"])
    printed: set[int] = set()
    header = True
    asr: bool | None = None  # the ASR columns: decided by the first row that has evaluations, then kept
    closed_seen: dict[int, float] = {}
    memory: dict[int, dict[str, int | None]] = {}  # round -> rss_bytes and peak_rss_bytes at its close
    last_line = ""  # without a terminal (a log): the progress as lines, one per round, attempt or upload
    last_steps, steps_read = "", 0.0  # and the training clients' local steps every STEPS_EVERY_S
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        bar = progress.add_task("waiting for clients", total=clients)
        while True:
            procs.check()
            rss = procs.rss_bytes()  # sampled every poll: results.json reports the peak
            status = admin.federation(fid)
            history = admin.rounds(fid)
            open_round = status.open_round
            buffer = status.buffer
            if open_round and buffer is not None:  # mode async: the buffer's fill, not a selection's uploads
                progress.update(
                    bar,
                    description=f"buffer {open_round.round}/{total_rounds}: updates",
                    completed=buffer.filled,
                    total=buffer.buffer_size,
                )
                line = (
                    f"buffer {open_round.round}/{total_rounds}: {buffer.filled}/{buffer.buffer_size} updates, "
                    f"{buffer.tasks_held} client(s) training"
                )
            elif open_round:
                parts = open_round.participants
                uploaded = sum(p.uploaded for p in parts)
                progress.update(
                    bar,
                    description=f"round {open_round.round}/{total_rounds}: uploads",
                    completed=uploaded,
                    total=len(parts),
                )
                line = (
                    f"round {open_round.round}/{total_rounds} attempt {open_round.attempt}: "
                    f"{uploaded}/{len(parts)} uploads"
                )
            elif status.state == FederationState.WAITING:
                progress.update(bar, completed=status.clients.enrolled, total=clients)
                line = f"waiting for clients: {status.clients.enrolled}/{clients} enrolled"
            else:
                line = ""
            if line and line != last_line and not console.is_terminal:  # a log: a line per change
                progress.console.print(line, soft_wrap=True)
                last_line = line
            if open_round and not console.is_terminal and time.monotonic() - steps_read >= STEPS_EVERY_S:
                steps_read = time.monotonic()
                steps = training_line(admin.clients(fid), open_round.round)
                if steps and steps != last_steps:
                    progress.console.print(steps, soft_wrap=True)
                    last_steps = steps
            active = status.clients.active
            for record in round_records(history, spec):
                r = record["round"]
                closed_seen.setdefault(r, time.monotonic())
                memory.setdefault(r, {"rss_bytes": rss, "peak_rss_bytes": procs.peak_rss})
                complete = record["eval_clients"] >= min(active, spec.get("evaluators") or active)
                if r not in printed and (complete or time.monotonic() - closed_seen[r] > EVAL_GRACE_S):
                    if asr is None and record["eval_clients"] > 0:
                        asr = has_asr(record)
                    start = initial_record(admin.evaluation(fid, 0)) if header else None
                    if start is not None:  # round 0 above round 1: the starting prompt's figures
                        progress.console.print(row_table(start, header, asr))
                        header = False
                    progress.console.print(row_table(record, header, asr))
                    header = False
                    printed.add(r)
            if status.state == FederationState.COMPLETED and len(printed) >= total_rounds:
                break
            time.sleep(0.5)
    initial = admin.evaluation(fid, 0)
    records = round_records(admin.rounds(fid), spec)
    attach_sites(records, site_fetcher(admin, fid))
    for record in records:
        record.update(memory.get(record["round"], {}))
    return records, initial


def site_fetcher(admin: Any, fid: int) -> Callable[[int], dict[str, Any] | None]:
    """A version's per-site evaluation, or None where the coordinator keeps it private (403)."""

    def fetch(version: int) -> dict[str, Any] | None:
        try:
            return admin.site_evaluations(fid, version)
        except ApiError as exc:
            if exc.status == 403:
                return None
            raise

    return fetch
