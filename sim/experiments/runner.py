"""Run an experiment grid: one `fedprompt simulate` process per cell, each in its own folder.

A cell whose folder holds a complete results.json is skipped, so running the same config again
resumes a half-finished grid (a cell interrupted mid-way continues its federation: simulate
resumes from its folder).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from fedprompt.sim.argv import to_args
from fedprompt.sim.experiments.config import Cell, ExperimentConfig, expand
from fedprompt.sim.options import IMPLIED_OPTIONS
from fedprompt.sim.supervisor import bin_path

# Options a cell may carry that simulate does not (yet) know, and the value that means "the default".
DEFAULT_VALUES: dict[str, Any] = {"method": "prompt_tuning"}

# Options that did not exist when some committed cells ran, and what those cells did instead: a record
# without the option matches whatever the config says. measure_asr: before it, every client with a
# target label measured the ASR (what measure_asr asks for); training is the same either way.
LEGACY_OPTIONS = {"measure_asr"}


def simulate_options() -> set[str]:
    """The option names `fedprompt simulate` accepts (its function's parameters)."""
    from fedprompt.sim.simulate import simulate_command

    return set(inspect.signature(simulate_command).parameters)


def unsupported(options: dict[str, Any], known: set[str]) -> dict[str, Any]:
    """Options simulate does not accept (those at their default value are dropped, not reported)."""
    return {k: v for k, v in options.items() if k not in known and DEFAULT_VALUES.get(k) != v}


# Options a cell's folder may record that do not change what it measures (its starting prompt is
# compared by sha256 elsewhere; the folder is where it ran).
_LOCATION_OPTIONS = frozenset({"init_prompt", "out"})


def _measured(options: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in normalised(options).items() if k not in _LOCATION_OPTIONS and v is not None}


def ran_with_other_options(folder: Path, options: dict[str, Any]) -> bool:
    """True when the cell's folder records (cell.json) that it ran as another cell than these options
    make (the config changed since): its results neither count as done nor go into a report. The
    cell's whole options are compared where cell.json has them (`cell_options`); an older cell.json
    has only what was passed to simulate, and each of those must still hold. A folder without
    cell.json (a run still going) records nothing."""
    meta_path = folder / "cell.json"
    if not meta_path.exists():
        return False
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError:
        return False
    wanted = _measured(options)
    if isinstance(meta.get("cell_options"), dict):
        return _measured(meta["cell_options"]) != wanted
    passed = meta.get("options")
    return isinstance(passed, dict) and any(wanted.get(k) != v for k, v in _measured(passed).items())


def is_complete(folder: Path, options: dict[str, Any]) -> bool:
    """True when the cell's results.json exists, holds every round and ran with these options."""
    path = folder / "results.json"
    if not path.exists() or ran_with_other_options(folder, options):
        return False
    try:
        results = json.loads(path.read_text())
    except json.JSONDecodeError:
        return False
    return holds_every_round(results, options)


def holds_every_round(results: dict[str, Any], options: dict[str, Any]) -> bool:
    """A results.json of a finished run: every round the options asked for, and a final accuracy (a run
    stopped mid-way leaves one without them)."""
    want = int(options.get("rounds", 0) or 0)
    return len(results.get("rounds", [])) >= want and results.get("final_accuracy") is not None


def normalised(options: dict[str, Any]) -> dict[str, Any]:
    """Options as they read back from a summary JSON (so that a committed cell compares equal)."""
    return json.loads(json.dumps(options, sort_keys=True, default=str))


def committed_cells(fig_dir: Path, name: str) -> dict[str, dict[str, Any]]:
    """The finished cells of an experiment's committed summary (`<fig_dir>/<name>.json`), by cell id."""
    path = fig_dir / f"{name}.json"
    if not path.exists():
        return {}
    return {r["cell"]: r for r in json.loads(path.read_text()).get("cells", []) if r.get("done")}


def same_options(recorded: dict[str, Any] | None, options: dict[str, Any]) -> bool:
    """True when a committed record ran with these options (a summary written before records carried
    their options matches by cell id alone; an option of LEGACY_OPTIONS it lacks is not compared, one
    of IMPLIED_OPTIONS it lacks reads as that option's value then)."""
    if recorded is None:
        return True
    wanted = normalised(options)
    missing = LEGACY_OPTIONS - set(recorded)
    implied = {k: v for k, v in IMPLIED_OPTIONS.items() if k not in recorded and k in wanted}
    return recorded | implied == {k: v for k, v in wanted.items() if k not in missing}


def outdated(record: dict[str, Any], options: dict[str, Any]) -> str | None:
    """Why a committed record measured something else than these options mean on this build (the
    report still shows it, labelled; the runner runs the cell again), or None."""
    if options.get("ldp_epsilon") is not None and record.get("ldp_sensitivity") is None:
        return "measured before LDP was calibrated to the sensitivity 2 × clip"
    return None


def stale_reason(record: dict[str, Any], options: dict[str, Any]) -> str | None:
    """Why the runner runs a committed cell again on this build (outdated LDP calibration, or the
    labels read through the tied embeddings before mean-pool scoring), or None."""
    if scored_before_mean_pool(record, options):
        return "scored through the tied input embeddings, before mean-pool scoring was the default"
    return outdated(record, options)


def scored_before_mean_pool(record: dict[str, Any], options: dict[str, Any]) -> bool:
    """True for a committed MiniLM cell that read its labels through the tied input embeddings (records
    carry `scoring` since mean-pool scoring became the default) while these options now mean
    mean-pool: the runner runs it again; the report says so under its table."""
    return record.get("scoring") is None and options.get("scoring", "auto") != "tied-embeddings"


def committed_match(
    committed: dict[str, dict[str, Any]], config: ExperimentConfig, cell: Cell, out_root: Path
) -> dict[str, Any] | None:
    """The committed record of this cell when it ran with the same options (see same_options) and,
    where this machine has the cell's starting prompt (its --init-prompt, or the trained warm
    start), from that same prompt."""
    record = committed.get(cell.id)
    if record is None or not same_options(record.get("options"), cell.options):
        return None
    local = local_start_sha(config, cell, out_root)
    if local is not None and record.get("start_sha256") != local:
        return None
    return record


def start_prompt_sha(path: str | Path | None) -> str | None:
    """sha256 of a starting prompt file (`--init-prompt`), or None without one (or when it is gone)."""
    if not path or not Path(path).is_file():
        return None
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _warm_prompt_path(config: ExperimentConfig, cell: Cell, out_root: Path) -> Path:
    return out_root / "warm" / f"{_key(warm_start_options(config, cell))}.safetensors"


def keep_warm_prompts(
    config: ExperimentConfig, records: list[dict[str, Any]], out_root: Path, fig_dir: Path
) -> None:
    """Copy the warm-start prompts that finished cells started from into `warm_prompts_dir(fig_dir)`,
    so a grid continued on another machine starts its remaining cells from the same prompts."""
    if config.warm_start is None:
        return
    used = {r.get("start_sha256") for r in records if r.get("done")}
    for cell in expand(config):
        if cell.options.get("init_prompt"):
            continue
        local = _warm_prompt_path(config, cell, out_root)
        if start_prompt_sha(local) in used:
            target = warm_prompts_dir(fig_dir) / local.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(local, target)


def local_start_sha(config: ExperimentConfig, cell: Cell, out_root: Path) -> str | None:
    """The starting prompt this machine already has for a cell (its --init-prompt, or the trained warm
    start), or None when that is not known here."""
    if cell.options.get("init_prompt"):
        return start_prompt_sha(cell.options["init_prompt"])
    if config.warm_start is not None:
        return start_prompt_sha(_warm_prompt_path(config, cell, out_root))
    return None


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def warm_start_options(config: ExperimentConfig, cell: Cell) -> dict[str, Any]:
    """The options of the clean one-client run whose final prompt a cell starts from."""
    assert config.warm_start is not None
    ws, opt = config.warm_start, cell.options
    keep = (
        "dataset",
        # a file's columns and labels, so the warm start reads it as the cells do
        "test_data",
        "text_column",
        "text_b_column",
        "label_column",
        "labels",
        "model",
        "num_virtual_tokens",
        "max_length",
        "template",
        "verbalizer",
        "batch_size",
        "lr",
        "precision",
    )
    out = {k: opt[k] for k in keep if k in opt}
    out |= {
        "clients": 1,
        "fraction": 1.0,
        "rounds": 1,
        "local_steps": ws.steps,
        "train_limit": ws.train_limit,
        "eval_limit": opt.get("eval_limit"),
        "target_label": opt.get("target_label"),
        "seed": ws.seed,
        "parallel": 1,
    }
    if ws.batch_size is not None:
        out["batch_size"] = ws.batch_size
    return out


def simulate_defaults() -> dict[str, Any]:
    """`fedprompt simulate`'s default value of each option."""
    from fedprompt.sim.simulate import simulate_command

    return {k: p.default for k, p in inspect.signature(simulate_command).parameters.items()}


def _invocation(options: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """What a cell asks of simulate, without its folders and without options at simulate's default:
    two cells with the same invocation (and the same starting prompt) run the same federation."""
    plain = normalised({k: v for k, v in options.items() if k not in _LOCATION_OPTIONS})
    at_default = normalised({k: defaults[k] for k in plain if k in defaults})
    return {k: v for k, v in plain.items() if k not in at_default or at_default[k] != v}


def find_twin(
    out_root: Path, config_name: str, options: dict[str, Any], start_sha: str | None
) -> Path | None:
    """A finished cell of another experiment under `out_root` that ran the same federation: the same
    simulate invocation (see _invocation) from the same starting prompt. Simulate is deterministic for
    given options and seed, so its folder is this cell's result; None when there is none."""
    defaults = simulate_defaults()
    wanted = _invocation(options, defaults)
    for meta_path in sorted(out_root.glob("*/*/cell.json")):
        folder = meta_path.parent
        if folder.parent.name == config_name or ".other-options-" in folder.name:
            continue
        try:
            meta = json.loads(meta_path.read_text())
        except json.JSONDecodeError:
            continue
        if meta.get("returncode") != 0 or meta.get("start_sha256") != start_sha:
            continue
        if not isinstance(meta.get("options"), dict) or _invocation(meta["options"], defaults) != wanted:
            continue
        if is_complete(folder, meta.get("cell_options") or meta["options"]):
            return folder
    return None


def _key(options: dict[str, Any]) -> str:
    text = json.dumps(options, sort_keys=True, default=str)
    # a file's name, not its path
    data = Path(str(options.get("dataset", "data"))).name.split(".")[0] or "data"
    name = f"{data}-{options.get('num_virtual_tokens', 20)}tok-{options['local_steps']}steps"
    return f"{name}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


Runner = Callable[[list[str], Path], int]


def _run_process(args: list[str], log: Path) -> int:
    """Run simulate with its output in a log file; returns the exit code."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as fh:
        return subprocess.run(args, stdout=fh, stderr=subprocess.STDOUT, env=_env(), check=False).returncode


def selected(params: dict[str, Any], where: Mapping[str, Collection[str]] | None) -> bool:
    """True when, for every key of `where`, the cell's grid value (as text) is one of its values."""
    return where is None or all(str(params.get(k)) in {str(v) for v in vals} for k, vals in where.items())


def run_experiment(
    config: ExperimentConfig,
    out_root: Path,
    *,
    echo: Callable[[str], None] = print,
    runner: Runner = _run_process,
    limit: int | None = None,
    seeds: Collection[int] | None = None,
    where: Mapping[str, Collection[str]] | None = None,
    committed: dict[str, dict[str, Any]] | None = None,
    committed_warm: Path | None = None,
    track: str | None = None,
) -> list[dict[str, Any]]:
    """Run every unfinished cell (at most `limit` of them, and only those of `seeds` and whose grid
    values are among `where`'s when given: a long grid can be taken whole for one seed, or for the
    variants that decide something, first); returns one status record per cell.

    `committed`: finished cells of the experiment's committed summary (`committed_cells`); a cell found
    there with the same options and the same starting prompt (for a warm start: the prompt trained
    here, compared by sha256) counts as done, so a grid resumes across machines.

    `committed_warm`: the folder of committed warm-start prompts (`warm_prompts_dir`, written by
    `report`); a warm start found there is used instead of being trained again. Another CPU's float
    kernels train a slightly different prompt, which would make every committed cell stale."""

    known = simulate_options()
    folder = out_root / config.name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(config.model_dump_json(indent=2))
    statuses: list[dict[str, Any]] = []
    started_cells = 0
    cells = expand(config)
    for n, cell in enumerate(cells, 1):
        cell_dir = folder / cell.id
        options = {k: v for k, v in cell.options.items() if k in known}
        missing = unsupported(cell.options, known)
        record: dict[str, Any] = {"cell": cell.id, "params": cell.params, "folder": str(cell_dir)}
        if missing:
            record["status"] = f"skipped: simulate has no option {sorted(missing)}"
            echo(f"[{n}/{len(cells)}] {cell.id}: {record['status']}")
            statuses.append(record)
            continue
        if ran_with_other_options(cell_dir, cell.options):
            # another config's run: set aside, so that simulate does not resume its federation
            aside = cell_dir.with_name(f"{cell_dir.name}.other-options-{int(time.time())}")
            cell_dir.rename(aside)
            echo(f"[{n}/{len(cells)}] {cell.id}: ran with other options; moved to {aside.name}")
        if is_complete(cell_dir, cell.options):
            record["status"] = "done"
            statuses.append(record)
            echo(f"[{n}/{len(cells)}] {cell.id}: done (skipped)")
            continue
        if committed and cell.id in committed:
            if config.warm_start is not None and "init_prompt" not in options:
                # the warm start first: a committed cell counts only if it started from this prompt
                options["init_prompt"] = str(
                    _warm_start(config, cell, out_root, echo, runner, committed_warm)
                )
            match = committed_match(committed, config, cell, out_root)
            stale = stale_reason(match, cell.options) if match is not None else None
            if match is not None and stale is None:
                record["status"] = "done"
                statuses.append(record)
                echo(f"[{n}/{len(cells)}] {cell.id}: done in the committed summary (skipped)")
                continue
            echo(
                f"[{n}/{len(cells)}] {cell.id}: the committed result "
                + (stale if stale else "ran with other options or prompt")
            )
        if (
            (limit is not None and started_cells >= limit)
            or (seeds is not None and cell.seed not in seeds)
            or not selected(cell.params, where)
        ):
            record["status"] = "pending"
            statuses.append(record)
            continue
        started_cells += 1
        if config.warm_start is not None and "init_prompt" not in options:
            options["init_prompt"] = str(_warm_start(config, cell, out_root, echo, runner, committed_warm))
        # a tracker logs the cell as a run named by its folder (its grid values and seed); it is how
        # the cell is watched, not what it is, so it stays out of the cell's options
        extra = {"track": track} if track else {}
        args = [bin_path("fedprompt"), "simulate", *to_args({**options, **extra, "out": str(cell_dir)})]
        start_sha = start_prompt_sha(options.get("init_prompt"))
        twin = None if cell_dir.exists() else find_twin(out_root, config.name, options, start_sha)
        meta_path = cell_dir / "cell.json"
        previous: dict[str, Any]
        if twin is not None:
            # the same federation already ran for another experiment: its folder is this cell's result
            shutil.copytree(twin, cell_dir)
            code, wall, previous = 0, 0.0, {}  # no time of its own: the twin's cell.json has it
            echo(f"[{n}/{len(cells)}] {cell.id}: the same federation as {twin.parent.name}/{twin.name}")
        else:
            echo(f"[{n}/{len(cells)}] {cell.id}: running")
            t0 = time.monotonic()
            code = runner(args, cell_dir / "simulate.log")
            wall = time.monotonic() - t0
            previous = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        meta = {
            "cell": cell.id,
            "params": cell.params,
            "options": options,
            "cell_options": normalised(cell.options),
            "command": " ".join(["fedprompt", *args[1:]]),
            "returncode": code,
            "wall_seconds": previous.get("wall_seconds", 0.0) + wall,
            "start_sha256": start_sha,
        }
        if twin is not None:
            meta["same_as"] = f"{twin.parent.name}/{twin.name}"
        cell_dir.mkdir(parents=True, exist_ok=True)
        meta_path.write_text(json.dumps(meta, indent=2))
        done = code == 0 and is_complete(cell_dir, cell.options)
        record["status"] = "done" if done else f"failed (exit {code})"
        echo(f"[{n}/{len(cells)}] {cell.id}: {record['status']} in {wall:.0f}s")
        statuses.append(record)
    return statuses


def warm_prompts_dir(fig_dir: Path) -> Path:
    """Where the warm-start prompts of the committed summaries live (`<fig_dir>/warm/<key>.safetensors`)."""
    return fig_dir / "warm"


def _warm_start(
    config: ExperimentConfig,
    cell: Cell,
    out_root: Path,
    echo: Callable[[str], None],
    runner: Runner,
    committed_warm: Path | None = None,
) -> Path:
    """The clean pre-trained prompt for a cell: the one this machine has, else the committed one, else
    trained once here (then reused by every cell that shares it)."""
    options = warm_start_options(config, cell)
    key = _key(options)
    folder = out_root / "warm" / key
    prompt = _warm_prompt_path(config, cell, out_root)
    if prompt.exists():
        return prompt.resolve()
    committed = committed_warm / prompt.name if committed_warm is not None else None
    if committed is not None and committed.is_file():
        prompt.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(committed, prompt)
        echo(f"warm start {key}: the committed prompt ({committed})")
        return prompt.resolve()
    echo(f"warm start {key}: one client, {options['local_steps']} steps")
    args = [
        bin_path("fedprompt"),
        "simulate",
        *to_args({**options, "out": str(folder), "save_prompt": str(prompt)}),
    ]
    code = runner(args, folder / "simulate.log")
    if code != 0 or not prompt.exists():
        raise RuntimeError(f"the warm-start run failed (exit {code}); see {folder / 'simulate.log'}")
    return prompt.resolve()
