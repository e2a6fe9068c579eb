"""Command lines of the processes simulate starts, spelled in one place.

Each dataclass's fields are the option names of a `fedprompt-worker` command (underscores for
dashes), so `to_args` is the only code that writes a flag; tests/sim/test_argv.py parses what it
writes with the worker's own commands.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fedprompt.sim.supervisor import bin_path


def to_args(options: Mapping[str, Any]) -> list[str]:
    """Command-line arguments from option names (underscores) and values: `--name value` each, a bare
    `--name` for True; None and False are left out, lists and dicts are written as JSON."""
    args: list[str] = []
    for key, value in options.items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        text = json.dumps(value) if isinstance(value, list | dict) else str(value)
        args += [flag] if value is True else [flag, text]
    return args


@dataclass(frozen=True)
class WorkerPool:
    """P of a simulation's worker processes: `fedprompt-worker pool` serving the clients of its file."""

    config: Path
    port: int
    log_level: str = "warning"

    def argv(self) -> list[str]:
        return [bin_path("fedprompt-worker"), "pool", *to_args(asdict(self))]


@dataclass(frozen=True)
class TrainLocal:
    """The centralised baseline: `fedprompt-worker train-local` with these options."""

    dataset: str
    model: str
    steps: int
    batch_size: int
    lr: float
    num_virtual_tokens: int
    max_length: int
    seed: int
    template: str
    verbalizer: list[list[str]]
    eval_every: int
    out: Path
    train_limit: int | None = None
    eval_limit: int | None = None
    scoring: str = "auto"
    init: str = "vocab"
    local_optimizer: str = "adamw"

    def argv(self) -> list[str]:
        return [bin_path("fedprompt-worker"), "train-local", *to_args(asdict(self))]
