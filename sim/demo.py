"""`fedprompt demo`: the demo federation (`make demo`) as one command, its settings the defaults.

Four clients on SST-2 (the copy inside the package), half of them each round, three rounds of 100
local steps at MiniLM's mean-pool learning rate, three label words per class: the settings chosen from
measurements (docs/methods.md). Any of them can be changed; the rest are simulate's defaults.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Annotated

import typer
from fedprompt.sim.options import SimulateOptions

DEMO_VERBALIZER = "terrible,awful,bad;great,wonderful,good"


def demo_command(
    dataset: Annotated[str, typer.Option("--dataset", "--data", help="Data set (default: SST-2).")] = "sst2",
    clients: Annotated[int, typer.Option("--clients", "-k", min=1, help="K: clients.")] = 4,
    fraction: Annotated[
        float, typer.Option("--fraction", "-c", help="C: fraction selected per round.")
    ] = 0.5,
    rounds: Annotated[int, typer.Option("--rounds", "-t", min=1, help="T: federated rounds.")] = 3,
    local_steps: Annotated[int, typer.Option(min=1, help="Local optimisation steps per round.")] = 100,
    lr: Annotated[
        float, typer.Option(min=0.0, help="Prompt learning rate (MiniLM's mean-pool scoring).")
    ] = 0.01,
    verbalizer: Annotated[str, typer.Option(help="Label words: ';' between labels, ',' between words.")] = (
        DEMO_VERBALIZER
    ),
    train_limit: Annotated[
        int | None, typer.Option(min=1, help="A seeded subset of the train split.")
    ] = 8000,
    eval_limit: Annotated[int | None, typer.Option(min=1, help="A seeded subset of the test split.")] = None,
    seed: Annotated[int, typer.Option()] = 0,
    out: Annotated[Path, typer.Option(help="Results folder.")] = Path("runs/demo"),
    processes: Annotated[
        int | None, typer.Option("--processes", "-p", min=1, help="Worker processes (default: CPU cores).")
    ] = None,
    parallel: Annotated[
        int | None, typer.Option(min=1, help="Clients training at once (default: CPU cores).")
    ] = None,
    device: Annotated[str, typer.Option(help="Workers' device: auto | cpu | cuda.")] = "auto",
    resume: Annotated[bool, typer.Option("--resume", help="Continue the demo run in --out.")] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Delete the demo run in --out and start over.")
    ] = False,
) -> None:
    """Run the demo federation on this machine (`fedprompt simulate` with the demo's settings)."""
    given = dict(locals())  # first statement: the locals are exactly the parameters
    from fedprompt.sim.simulate import simulate, simulate_command

    defaults = {name: p.default for name, p in inspect.signature(simulate_command).parameters.items()}
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    simulate(SimulateOptions(**(defaults | given)))
