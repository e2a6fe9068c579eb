"""The centralised baseline: `fedprompt-worker train-local` on the same samples the federation trained on."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from fedprompt.shared.spec import FederationSpec
from fedprompt.sim.argv import TrainLocal
from fedprompt.sim.supervisor import die_with_parent
from fedprompt.sim.tables import console

STOPPED = "stopped with simulate"  # the reason of a baseline stopped because simulate was


def run_baseline(
    out: Path,
    dataset: Path,
    spec: FederationSpec,
    steps: int,
    train_limit: int | None,
    eval_limit: int | None,
) -> dict[str, Any]:
    """Centralised prompt tuning with the same engine and the same number of training samples."""
    path = out / "baseline.json"
    command = TrainLocal(
        dataset=str(dataset),
        model=spec.model,
        steps=steps,
        batch_size=spec.batch_size,
        lr=spec.lr,
        num_virtual_tokens=spec.num_virtual_tokens,
        max_length=spec.max_length,
        seed=spec.seed,
        template=spec.template,
        verbalizer=spec.verbalizer,
        eval_every=0,
        out=path,
        train_limit=train_limit or None,
        eval_limit=eval_limit or None,
        scoring=spec.scoring,
        local_optimizer=spec.local_optimizer,
    )
    console.print(f"[bold]baseline:[/] centralised prompt tuning, {steps} steps of batch {spec.batch_size}")
    started = time.monotonic()
    path.unlink(missing_ok=True)  # a previous attempt's file is not this run's
    proc = subprocess.Popen(command.argv(), preexec_fn=die_with_parent)
    try:
        code = proc.wait()
    except KeyboardInterrupt:  # this process was stopped: stop the baseline, keep what it wrote
        proc.terminate()
        code = proc.wait()
        return _outcome(path, steps, started, code, interrupted=STOPPED)
    return _outcome(path, steps, started, code)


def _outcome(
    path: Path, steps: int, started: float, code: int, interrupted: str | None = None
) -> dict[str, Any]:
    """The baseline's record in results.json: its accuracy when it finished, else what it measured,
    labelled partial with the reason (a signal's name, an exit code)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    record: dict[str, Any] = {
        "steps": steps,
        "accuracy": data.get("final_accuracy") if code == 0 else None,
        "seconds": time.monotonic() - started,
        "file": str(path) if data else None,
        "status": "complete" if code == 0 else "partial",
    }
    if code != 0:
        stopped = data.get("stopped") or {}
        reason = interrupted or (f"stopped by {stopped['signal']}" if stopped else _exit_text(code))
        record |= {
            "interrupted": reason,
            "steps_done": data.get("steps_done", stopped.get("at_step")),
            "last_evaluation": data.get("last_evaluation"),
        }
        console.print(
            f"[yellow]baseline {reason}[/]: its results are partial (no final accuracy)", soft_wrap=True
        )
    return record


def _exit_text(code: int) -> str:
    """'exited with code 1' or 'killed by SIGTERM' for a child's return code."""
    import signal

    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    if code in (130, 143):
        return f"stopped by {'SIGINT' if code == 130 else 'SIGTERM'}"
    return f"exited with code {code}"
