"""`python -m fedprompt.sim.experiments.norms`: the norms of honest prompt updates, to set an LDP clipping bound from.

An LDP grid's clipping bound should sit near the norm an honest client's update actually has: far
above it, the noise (scaled to the bound) drowns an update that never needed clipping. This trains
one client's share of a data set for a round's local steps from a starting prompt (the grids' warm
start) several times, each from a different random share and batch order, and writes each update's
L1 and L2 norm (new prompt - starting prompt) with their medians to a JSON file.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import typer

app = typer.Typer(add_completion=False, help=__doc__)


@app.command()
def main(
    init_prompt: Path = typer.Option(
        ..., exists=True, dir_okay=False, help="Starting prompt (.safetensors)."
    ),
    out: Path = typer.Option(..., help="JSON file to write."),
    dataset: str = typer.Option("sst2"),
    train_limit: int = typer.Option(2000, help="Training examples the federation shares out."),
    clients: int = typer.Option(10, help="A client's share is train_limit / clients examples."),
    local_steps: int = typer.Option(5),
    batch_size: int = typer.Option(8),
    lr: float = typer.Option(0.01),
    max_length: int = typer.Option(64),
    repeats: int = typer.Option(10, min=1),
    model: str = typer.Option("all-MiniLM-L6-v2"),
) -> None:
    from fedprompt.shared.privacy import l1_norm, l2_norm, update_delta
    from fedprompt.worker.data.dataset import load_dataset
    from fedprompt.worker.data.presets import preset_for
    from fedprompt.worker.engine.engine import PromptEngine

    examples = list(load_dataset(dataset, "train"))[:train_limit]
    share = max(1, len(examples) // clients)
    preset = preset_for(dataset)
    if preset is None:
        raise typer.BadParameter(
            f"{dataset!r} has no preset template and label words", param_hint="--dataset"
        )
    engine = PromptEngine.load(
        model, template=preset.template, verbalizer=preset.verbalizer, max_length=max_length
    )
    engine.load_prompt(init_prompt.read_bytes())
    start = engine.get_prompt()
    rows = []
    for seed in range(repeats):
        pick = np.random.default_rng(seed).choice(len(examples), size=share, replace=False)
        engine.set_prompt(start)
        engine.train([examples[i] for i in pick], steps=local_steps, batch_size=batch_size, lr=lr, seed=seed)
        delta = update_delta(engine.get_prompt(), start)
        rows.append({"seed": seed, "l1": l1_norm(delta), "l2": l2_norm(delta)})
        typer.echo(f"seed {seed}: L1 {rows[-1]['l1']:.1f}  L2 {rows[-1]['l2']:.3f}")
    result = {
        "dataset": dataset,
        "init_prompt": init_prompt.name,
        "model": model,
        "share": share,
        "local_steps": local_steps,
        "batch_size": batch_size,
        "lr": lr,
        "max_length": max_length,
        "elements": int(sum(v.size for v in start.values())),
        "updates": rows,
        "median_l1": statistics.median(r["l1"] for r in rows),
        "median_l2": statistics.median(r["l2"] for r in rows),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    typer.echo(f"median L1 {result['median_l1']:.1f}, median L2 {result['median_l2']:.3f} -> {out}")


if __name__ == "__main__":
    app()
