"""`fedprompt simulate --out`: whether a results folder is new, holds this command's run, or another's.

simulation.json records the options of the run a folder holds. A command whose options differ is
refused (exit 2) with one line that says what differs; `--resume` continues the folder's run (only when
the options match), `--force` deletes what a simulation wrote there and starts over. The same options
without a flag continue the run, and say so: the result is the run the command asks for.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from enum import Enum
from pathlib import Path
from typing import Any

from fedprompt.sim.options import IMPLIED_OPTIONS

# Options that say how a run is carried out, not what it computes: they may change between two
# invocations of the same run (a rerun on fewer cores, another device, a baseline added afterwards).
HOW_NOT_WHAT = frozenset(
    {
        "out",
        "parallel",
        "processes",
        "device",
        "database_url",
        "baseline",
        "save_prompt",
        "track",
        "dashboard_port",
        "resume",
        "force",
    }
)
# What simulate writes in --out (nothing else there is deleted by --force).
WRITTEN = (
    "simulation.json",
    "fedprompt.db",
    "fedprompt.db-wal",
    "fedprompt.db-shm",
    "admin-token",
    "results.json",
    "rounds.csv",
    "accuracy.png",
    "asr.png",
    "baseline.json",
    "baseline.png",
    "logs",
    "workers",
    "pools",
    "slots",
    "data",
)


class OutError(ValueError):
    """--out holds another run (or none to resume): the message says what to pass."""


class OutState(Enum):
    NEW = "new"  # nothing there: start a run
    CONTINUE = "continue"  # the same options: continue the run


def recorded_options(opts: Any) -> dict[str, Any]:
    """The options that define a run, JSON-ready (paths as text), for simulation.json."""
    fields = dataclasses.asdict(opts)
    return {
        k: (str(v) if isinstance(v, Path) else v) for k, v in sorted(fields.items()) if k not in HOW_NOT_WHAT
    }


def _text(name: str, value: Any) -> str:
    shown = "default" if value is None else (str(value).lower() if isinstance(value, bool) else value)
    return f"{name.replace('_', '-')} {shown}"


def differences(
    stored: dict[str, Any],
    current: dict[str, Any],
    stored_lr: float | None,
    defaults: dict[str, Any] | None = None,
) -> list[str]:
    """The option names whose values differ. An lr left unset matches the lr the stored run resolved
    (the same scoring resolves the same default; a different model or scoring shows by itself). An
    option newer than the stored run matches it at its default (the run had none: it ran as that; the
    caller passes, for an option whose default changed since, the value it had then)."""
    names = []
    for name in sorted(set(stored) | set(current)):
        old, new = stored.get(name), current.get(name)
        if name not in stored and defaults and name in defaults and new == defaults[name]:
            continue
        if name == "lr" and (old is None) != (new is None):
            old = stored_lr if old is None else old
            new = stored_lr if new is None else new
        if old != new:
            names.append(name)
    return names


def check_out(opts: Any, out: Path) -> OutState:
    """NEW or CONTINUE for this command in `out`; an OutError (one line: what differs and what to pass)
    when the folder holds another run, or when --resume finds none. --force is applied before (wipe)."""
    state_path = out / "simulation.json"
    if not state_path.exists():
        if getattr(opts, "resume", False):
            raise OutError(f"--resume: {out} holds no run to continue; leave out --resume to start one")
        return OutState.NEW
    setup = json.loads(state_path.read_text())
    stored = setup.get("options")
    if stored is None:
        if getattr(opts, "resume", False):
            return OutState.CONTINUE
        raise OutError(
            f"{out} holds a run whose options were not recorded: pass --resume to continue it or --force to "
            "start over"
        )
    defaults = {f.name: f.default for f in dataclasses.fields(opts) if f.default is not dataclasses.MISSING}
    defaults |= IMPLIED_OPTIONS  # what a run without the option ran with
    differ = differences(stored, current := recorded_options(opts), setup.get("lr"), defaults)
    if not differ:
        return OutState.CONTINUE
    resolved = setup.get("lr")
    old = ", ".join(
        f"lr {resolved:g} (the default)"
        if n == "lr" and stored.get(n) is None and resolved
        else _text(n, stored.get(n))
        for n in differ
    )
    new = ", ".join(_text(n, current.get(n)) for n in differ)
    raise OutError(
        f"{out} holds a run with {old}; this command has {new}: repeat that run's options (with --resume) to "
        "continue it, pass --force to start over, or choose another --out"
    )


def wipe(out: Path, keep: tuple[str, ...] = ()) -> list[str]:
    """Delete what a simulation wrote in `out` (only those names, less `keep`); the names deleted."""
    gone = []
    for name in (n for n in WRITTEN if n not in keep):
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            continue
        gone.append(name)
    return gone
