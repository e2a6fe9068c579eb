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
    )
    console.print(f"[bold]baseline:[/] centralised prompt tuning, {steps} steps of batch {spec.batch_size}")
    started = time.monotonic()
    subprocess.run(command.argv(), check=True, preexec_fn=die_with_parent)
    data = json.loads(path.read_text())
    return {
        "steps": steps,
        "accuracy": data.get("final_accuracy"),
        "seconds": time.monotonic() - started,
        "file": str(path),
    }
