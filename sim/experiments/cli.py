"""`fedprompt experiment run | report`: experiment grids over simulate, and their RESULTS.md tables."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

app = typer.Typer(help="Run experiment grids (many simulations) and report them.", no_args_is_help=True)
console = Console(soft_wrap=True)  # cell ids stay on one line in logs

OutOpt = Annotated[Path, typer.Option("--out", help="Where cell folders live.")]
FiguresOpt = Annotated[
    Path, typer.Option("--figures", help="Where PNGs and the committed summaries (<name>.json) live.")
]


@app.command("run")
def run_command(
    config: Annotated[Path, typer.Argument(help="experiments/<name>.yaml")],
    out: OutOpt = Path("runs/experiments"),
    limit: Annotated[int | None, typer.Option(min=1, help="Run at most this many unfinished cells.")] = None,
    seeds: Annotated[
        str | None,
        typer.Option(
            help="Run only the cells of these seeds (comma-separated, e.g. 0): a long grid whole for one seed first."
        ),
    ] = None,
    where: Annotated[
        list[str] | None,
        typer.Option(
            help="Run only the cells with these grid values, as key=v1,v2 (repeatable, e.g. "
            "--where variant=fedavg,balanced --where partition=iid,label:0.1).",
        ),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List the cells and their state only.")] = False,
    figures: FiguresOpt = Path("docs/results"),
    rerun: Annotated[
        bool, typer.Option("--rerun", help="Run cells the committed summary already holds, too.")
    ] = False,
    track: Annotated[
        str | None,
        typer.Option(
            help="Log each cell it runs to MLflow as its own run (mlflow or mlflow:URI; see simulate)."
        ),
    ] = None,
) -> None:
    """Run every unfinished cell of an experiment (finished cells are skipped: rerun to resume).

    A cell counts as finished when its folder under --out holds every round, or when the committed
    summary (--figures/<name>.json, written by `report`) holds it with the same options and the same
    starting prompt: a grid run in parts on different machines resumes where the last `report` left
    it. A warm start committed by `report` (--figures/warm/) is used instead of training it again, so
    the remaining cells start from the prompt the committed ones did."""
    from fedprompt.sim.experiments.config import ConfigError, expand, load_config
    from fedprompt.sim.experiments.runner import (
        committed_cells,
        committed_match,
        is_complete,
        run_experiment,
        selected,
        stale_reason,
        warm_prompts_dir,
    )
    from fedprompt.sim.options import check_track

    try:
        cfg = load_config(config)
        check_track(track)
    except (ConfigError, ValueError) as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    only = _seed_list(seeds, cfg.seeds)
    chosen = _where(where or [], cfg)
    committed = {} if rerun else committed_cells(figures, cfg.name)
    if dry_run:
        cells = [c for c in expand(cfg) if (only is None or c.seed in only) and selected(c.params, chosen)]
        console.print(f"{cfg.name}: {len(cells)} cells (seeds {only or cfg.seeds})")
        for cell in cells:
            match = committed_match(committed, cfg, cell, out)
            stale = stale_reason(match, cell.options) if match is not None else None
            if is_complete(out / cfg.name / cell.id, cell.options):
                state = "done"
            elif match is not None and stale is None:
                state = "done (committed)"
            else:
                state = "todo"
            console.print(f"{state:16} {cell.id}" + (f"  ({stale})" if stale else ""))
        return
    statuses = run_experiment(
        cfg,
        out,
        echo=console.print,
        limit=limit,
        seeds=only,
        where=chosen,
        committed=committed,
        committed_warm=warm_prompts_dir(figures),
        track=track,
    )
    failed = [s for s in statuses if s["status"].startswith("failed")]
    done = sum(s["status"] == "done" for s in statuses)
    console.print(f"{cfg.name}: {done}/{len(statuses)} cells done, {len(failed)} failed")
    if failed:
        raise typer.Exit(1)


def _seed_list(text: str | None, grid: list[int]) -> list[int] | None:
    """`--seeds 0,2` as a list of the config's seeds; exits with a message naming them otherwise."""
    if text is None:
        return None
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        seeds = []
    if not seeds or not set(seeds) <= set(grid):
        console.print(f"[red]error:[/] --seeds {text!r}: give comma-separated seeds of the config's {grid}")
        raise typer.Exit(2)
    return seeds


def _where(texts: list[str], cfg: Any) -> dict[str, list[str]] | None:
    """`--where key=v1,v2` as {key: [v1, v2]}; exits with a message naming the grid's keys and values otherwise."""
    if not texts:
        return None
    from fedprompt.sim.experiments.config import expand

    values: dict[str, set[str]] = {}
    for cell in expand(cfg):
        for key, value in cell.params.items():
            values.setdefault(key, set()).add(str(value))
    chosen: dict[str, list[str]] = {}
    for text in texts:
        key, sep, rest = text.partition("=")
        wanted = [v.strip() for v in rest.split(",") if v.strip()]
        key = key.strip()
        if not sep or key not in values or not wanted or not set(wanted) <= values[key]:
            known = "; ".join(f"{k}: {', '.join(sorted(v))}" for k, v in values.items())
            console.print(
                f"[red]error:[/] --where {text!r}: give key=value[,value] with the grid's values ({known})"
            )
            raise typer.Exit(2)
        chosen.setdefault(key, []).extend(wanted)
    return chosen


@app.command("report")
def report_command(
    configs: Annotated[
        list[Path] | None, typer.Argument(help="Configs to report (default: experiments/*.yaml).")
    ] = None,
    out: OutOpt = Path("runs/experiments"),
    results: Annotated[Path, typer.Option(help="The markdown file to update.")] = Path("RESULTS.md"),
    figures: FiguresOpt = Path("docs/results"),
) -> None:
    """Take the cells run here into the named experiments' summaries and figures, then write RESULTS.md
    whole from every config in experiments/ (tests/sim/test_results_render.py checks it)."""
    from fedprompt.sim.experiments.config import ConfigError
    from fedprompt.sim.experiments.report import report

    every = sorted(Path("experiments").glob("*.yaml"))
    paths = configs or every
    try:
        summaries = report(paths, out, results, figures, Path.cwd(), document=every or paths)
    except ConfigError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    for name, records in summaries.items():
        console.print(f"{name}: {sum(r['done'] for r in records)}/{len(records)} cells")
    console.print(
        f"updated {results}" + (" and the README's findings table" if Path("README.md").is_file() else "")
    )
