"""fedprompt: the operator's CLI over the coordinator's REST API (and `simulate`, `experiment`, `data`).

What it prints is in operator_views.py; `simulate` and `experiment` are registered where the worker
extra (torch) is installed."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from fedprompt.shared.client import ApiError, CoordinatorClient
from fedprompt.shared.contract import FederationStatus
from fedprompt.sim.operator_views import (
    console,
    deadline_text,
    err,
    federation_line,
    fmt,
    latest_attempt,
    progress_bar,
    rounds_table,
    show,
    status_table,
    upload_counts,
)
from rich.table import Table

from fedprompt.clikit import make_app

# One name per concept across the three command lines: the coordinator's address is --coordinator /
# FEDPROMPT_COORDINATOR, as on the worker (--url and FEDPROMPT_URL still work, unlisted).
app = make_app(
    "fedprompt: operate federated prompt tuning.",
    aliases={"--url": "--coordinator"},
    env={"FEDPROMPT_URL": "FEDPROMPT_COORDINATOR"},
)
federation_app = typer.Typer(help="Create and inspect federations.", no_args_is_help=True)
token_app = typer.Typer(help="Enrollment tokens.", no_args_is_help=True)
clients_app = typer.Typer(help="Enrolled clients.", no_args_is_help=True)
round_app = typer.Typer(help="Open and close rounds.", no_args_is_help=True)
rounds_app = typer.Typer(help="Round history.", no_args_is_help=True)
prompt_app = typer.Typer(help="Download global prompts.", no_args_is_help=True)
for sub, name in [
    (federation_app, "federation"),
    (token_app, "token"),
    (clients_app, "clients"),
    (round_app, "round"),
    (rounds_app, "rounds"),
    (prompt_app, "prompt"),
]:
    app.add_typer(sub, name=name)


UrlOpt = Annotated[
    str, typer.Option("--coordinator", envvar="FEDPROMPT_COORDINATOR", help="Coordinator base URL.")
]
TokenOpt = Annotated[
    str | None,
    typer.Option("--token", envvar="FEDPROMPT_ADMIN_TOKEN", help="Admin token.", show_default=False),
]
FedOpt = Annotated[int, typer.Option("--federation", "-f", help="Federation id.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable JSON output.")]
TimeoutOpt = Annotated[
    float, typer.Option("--timeout", min=0, help="Give up after this many seconds (exit code 3).")
]
IntervalOpt = Annotated[float, typer.Option("--interval", min=0.05, help="Seconds between polls.")]
DEFAULT_URL = "http://127.0.0.1:8000"
EXIT_TIMEOUT = 3
# Indirections so tests can drive the wait loops without real time passing.
_sleep: Callable[[float], None] = time.sleep
_monotonic: Callable[[], float] = time.monotonic


def _client(url: str, token: str | None) -> CoordinatorClient:
    if not token:
        err.print("[red]error:[/] no admin token: pass --token or set FEDPROMPT_ADMIN_TOKEN")
        raise typer.Exit(2)
    return CoordinatorClient(url, token)


def _run(fn: Any, *args: Any, **kw: Any) -> Any:
    """Call the API, turning errors into one readable line and exit code 1."""
    import httpx

    try:
        return fn(*args, **kw)
    except ApiError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(1) from None
    except httpx.HTTPError as exc:
        err.print(f"[red]error:[/] cannot reach the coordinator: {exc}")
        raise typer.Exit(1) from None


def _as_json(status: FederationStatus) -> dict[str, Any]:
    """A federation's status as the JSON object the coordinator answered: what --json prints and the
    views read."""
    return status.model_dump(mode="json", exclude_unset=True)


def _emit(data: Any, as_json: bool, render: Any = None) -> None:
    if as_json or render is None:
        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    else:
        render(data)


@federation_app.command("create")
def federation_create(
    spec: Annotated[
        Path, typer.Option("--spec", exists=True, dir_okay=False, help="FederationSpec JSON file.")
    ],
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a federation from a spec file."""
    try:
        body = json.loads(spec.read_text())
    except json.JSONDecodeError as exc:
        err.print(f"[red]error:[/] {spec} is not valid JSON: {exc}")
        raise typer.Exit(2) from None
    with _client(url, token) as c:
        fed = _as_json(_run(c.create_federation, body))
    _emit(fed, as_json, lambda f: console.print(f"created federation [bold]{f['id']}[/] ({f['name']})"))


@federation_app.command("status")
def federation_status(
    federation: Annotated[
        int | None, typer.Option("--federation", "-f", help="Federation id (default: all).")
    ] = None,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Status of one federation or all of them."""
    with _client(url, token) as c:
        statuses = _run(c.federations) if federation is None else [_run(c.federation, federation)]
        feds = [_as_json(status) for status in statuses]
    _emit(feds if federation is None else feds[0], as_json, lambda _: status_table(feds))


@federation_app.command("pause")
def federation_pause(
    federation: FedOpt, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """Stop opening rounds automatically."""
    with _client(url, token) as c:
        fed = _as_json(_run(c.pause, federation))
    _emit(fed, as_json, lambda f: console.print(f"federation {f['id']} paused (state {f['state']})"))


@federation_app.command("resume")
def federation_resume(
    federation: FedOpt, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """Open rounds automatically again."""
    with _client(url, token) as c:
        fed = _as_json(_run(c.resume, federation))
    _emit(fed, as_json, lambda f: console.print(f"federation {f['id']} resumed (state {f['state']})"))


@federation_app.command("wait")
def federation_wait(
    federation: FedOpt,
    until_round: Annotated[
        int | None,
        typer.Option("--round", min=1, help="Stop once this round has closed (default: all rounds)."),
    ] = None,
    timeout: TimeoutOpt = 24 * 3600.0,
    interval: IntervalOpt = 2.0,
    eval_wait: Annotated[
        float,
        typer.Option(
            "--eval-wait",
            min=0,
            help="After the last round closes, wait up to this many seconds for every active client's "
            "evaluation of its prompt (then return with what was reported).",
        ),
    ] = 300.0,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Wait until the federation completes (or a round closes) and its evaluation is recorded, with a
    progress bar over rounds."""
    with _client(url, token) as c:
        fed = _as_json(_run(c.federation, federation))
        goal = min(until_round or fed["rounds_total"], fed["rounds_total"])
        give_up = _monotonic() + timeout
        closed_at: float | None = None  # when the goal round was first seen closed
        with progress_bar(as_json) as progress:
            task = progress.add_task(fed["name"], total=goal, left="")
            while True:
                progress.update(
                    task, completed=min(fed["latest_version"], goal), description=federation_line(fed)
                )
                if fed["state"] == "completed" or fed["latest_version"] >= goal:
                    closed_at = _monotonic() if closed_at is None else closed_at
                    if _evaluated(fed, goal) or _monotonic() - closed_at >= eval_wait:
                        break
                    progress.update(task, description=f"{federation_line(fed)}: waiting for its evaluation")
                if _monotonic() >= give_up:
                    err.print(f"[red]timeout:[/] {federation_line(fed)} after {timeout:g} s")
                    raise typer.Exit(EXIT_TIMEOUT)
                _sleep(interval)
                fed = _as_json(_run(c.federation, federation))
        if not _evaluated(fed, goal):
            err.print(
                f"[yellow]note:[/] not every active client had reported its evaluation after {eval_wait:g} s"
            )
        rows = _run(c.rounds, federation) if not as_json else []
    _emit(fed, as_json, lambda _: rounds_table(rows))


def _evaluated(fed: dict[str, Any], goal: int) -> bool:
    """Whether the prompt of round `goal` (or a later one) has every active client's evaluation."""
    latest = fed.get("latest") or {}
    if (latest.get("round") or 0) > goal:
        return True  # a later round closed: round `goal`'s evaluation is not the status's to show
    evaluation = latest.get("evaluation") or {}
    return evaluation.get("accuracy") is not None and int(evaluation.get("clients") or 0) >= int(
        fed["clients"]["active"]
    )


@token_app.command("create")
def token_create(
    federation: FedOpt,
    expires_in: Annotated[float | None, typer.Option(help="Seconds until it expires.")] = None,
    max_uses: Annotated[int | None, typer.Option(help="How many enrollments it allows.")] = None,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Issue an enrollment token (printed once)."""
    with _client(url, token) as c:
        value = _run(c.create_enrollment_token, federation, expires_in_s=expires_in, max_uses=max_uses)
    _emit({"token": value}, as_json, lambda d: sys.stdout.write(d["token"] + "\n"))


@clients_app.command("list")
def clients_list(
    federation: FedOpt, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """Enrolled clients."""
    with _client(url, token) as c:
        rows = _run(c.clients, federation)

    def render(rows: list[dict[str, Any]]) -> None:
        table = Table(title=f"clients of federation {federation}")
        for col in ("id", "name", "samples", "rounds", "updates", "revoked"):
            table.add_column(col)
        for r in rows:
            table.add_row(
                str(r["id"]),
                r["name"],
                str(r["num_samples"]),
                str(r["rounds_selected"]),
                str(r["updates"]),
                "yes" if r["revoked"] else "",
            )
        show(table)

    _emit(rows, as_json, render)


@clients_app.command("revoke")
def clients_revoke(
    federation: FedOpt,
    client: Annotated[int, typer.Argument(help="Client id.")],
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Revoke a client."""
    with _client(url, token) as c:
        _run(c.revoke_client, federation, client)
    _emit(
        {"federation_id": federation, "client_id": client, "revoked": True},
        as_json,
        lambda _: console.print(f"client {client} revoked"),
    )


@round_app.command("open")
def round_open(
    federation: FedOpt, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """Open the next round now."""
    with _client(url, token) as c:
        rnd = _run(c.open_round, federation)
    _emit(
        rnd,
        as_json,
        lambda r: console.print(f"round {r['round']} open with {len(r['participants'])} clients"),
    )


@round_app.command("close")
def round_close(
    federation: FedOpt,
    number: Annotated[int, typer.Argument(help="Round number.")],
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Aggregate the open round now with the updates that arrived."""
    with _client(url, token) as c:
        rnd = _run(c.close_round, federation, number)
    _emit(
        rnd,
        as_json,
        lambda r: console.print(f"round {r['round']} closed → prompt version {r['result_version']}"),
    )


@round_app.command("wait")
def round_wait(
    federation: FedOpt,
    number: Annotated[
        int | None, typer.Argument(help="Round number (default: the current round).", show_default=False)
    ] = None,
    timeout: TimeoutOpt = 3600.0,
    interval: IntervalOpt = 1.0,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Wait until a round has closed (failed attempts are retried), with a progress bar of its uploads."""
    with _client(url, token) as c:
        fed = _as_json(_run(c.federation, federation))
        target = number or max(fed["current_round"], 1)
        if target > fed["rounds_total"]:
            err.print(f"[red]error:[/] federation {federation} has only {fed['rounds_total']} rounds")
            raise typer.Exit(2)
        give_up = _monotonic() + timeout
        with progress_bar(as_json) as progress:
            task = progress.add_task(f"round {target}", total=None, left="")
            while True:
                rnd = latest_attempt(_run(c.rounds, federation), target)
                if rnd is not None:
                    uploaded, selected = upload_counts(rnd)
                    progress.update(
                        task,
                        total=selected,
                        completed=uploaded,
                        description=f"round {target} attempt {rnd['attempt']}: {rnd['state']}",
                        left=deadline_text(rnd, time.time()),
                    )
                    if rnd["state"] == "closed":
                        break
                if _monotonic() >= give_up:
                    state = rnd["state"] if rnd else "not opened yet"
                    err.print(f"[red]timeout:[/] round {target} is {state} after {timeout:g} s")
                    raise typer.Exit(EXIT_TIMEOUT)
                _sleep(interval)

    def render(r: dict[str, Any]) -> None:
        acc = (r.get("evaluation") or {}).get("accuracy")
        console.print(
            f"round {r['round']} closed ({r['closed_by']}) after {fmt(r['seconds'], 1)} s → "
            f"prompt version {r['result_version']}" + (f", accuracy {acc:.4f}" if acc is not None else "")
        )

    _emit(rnd, as_json, render)


@rounds_app.command("list")
def rounds_list(
    federation: FedOpt, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """Round history."""
    with _client(url, token) as c:
        rows = _run(c.rounds, federation)
    _emit(rows, as_json, rounds_table)


VERSION_HELP = (
    "Version number, 'latest', or 'best': the version with the best macro-F1 in the clients' "
    "evaluations, never a collapsed one (`fedprompt federations show` names it; the latest before any "
    "evaluation)."
)


@prompt_app.command("get")
def prompt_get(
    federation: FedOpt,
    out: Annotated[Path, typer.Option("--out", help="Where to write the safetensors file.")],
    version: Annotated[str, typer.Option("--version", help=VERSION_HELP)] = "best",
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Download a global prompt version as safetensors."""
    from fedprompt.shared import wire

    with _client(url, token) as c:
        prompt = _run(c.prompt, federation, version)
    if wire.sha256(prompt.blob) != prompt.sha256:
        err.print("[red]error:[/] download corrupted (sha256 mismatch); try again")
        raise typer.Exit(1)
    out.write_bytes(prompt.blob)
    info = {"version": prompt.version, "sha256": prompt.sha256, "bytes": len(prompt.blob), "path": str(out)}
    _emit(
        info,
        as_json,
        lambda d: console.print(
            f"prompt version {d['version']} ({d['bytes']} bytes, sha256 {d['sha256'][:12]}…) → {d['path']}"
        ),
    )


@app.command("export")
def export_prompt(
    federation: FedOpt,
    out: Annotated[Path, typer.Option("--out", help="Folder to write the adapter into.")],
    version: Annotated[str, typer.Option("--version", help=VERSION_HELP)] = "best",
    fmt: Annotated[str, typer.Option("--format", help="Export format: peft.")] = "peft",
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Write a global prompt as a PEFT adapter folder (PeftModel.from_pretrained(base, OUT) loads it)."""
    from fedprompt.shared.export import ExportError, unpack

    with _client(url, token) as c:
        archive = _run(c.export, federation, version, fmt)
    try:
        files = unpack(archive, out)
    except (ExportError, ValueError) as exc:
        err.print(f"[red]error:[/] the export is not a valid archive: {exc}")
        raise typer.Exit(1) from None
    info = {"format": fmt, "out": str(out), "files": sorted(p.name for p in files)}
    _emit(
        info,
        as_json,
        lambda d: console.print(f"{d['format']} adapter → {d['out']} ({', '.join(d['files'])})"),
    )


@app.command("comm-table")
def comm_table_command(
    tokens: Annotated[int, typer.Option("--tokens", min=1, help="Virtual tokens per prompt.")] = 20,
    model: Annotated[
        list[str] | None,
        typer.Option(
            "--model", help="Vendored name, model folder or config.json (repeatable; default: the four)."
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Parameters communicated per round per method vs. full fine-tuning, counted from configs (no weights)."""
    try:
        from fedprompt.worker.engine.params import TABLE_MODELS, comm_table, markdown
    except ImportError:
        err.print(
            "[red]error:[/] comm-table needs the worker extra (torch, transformers): pip install 'fedprompt[worker]'"
        )
        raise typer.Exit(2) from None
    rows = comm_table(tuple(model) if model else TABLE_MODELS, tokens)
    if as_json:
        _emit([r.to_dict() for r in rows], True)
    else:
        sys.stdout.write(markdown(rows) + "\n")


def _register_simulate() -> None:
    import importlib.util

    if importlib.util.find_spec("torch") is None:  # a coordinator-only install has no worker extra
        return
    from fedprompt.sim.simulate import simulate_command

    app.command(
        "simulate", help="Run a whole federation on this machine (coordinator + K worker processes)."
    )(simulate_command)
    from fedprompt.sim.demo import demo_command

    app.command(
        "demo", help="Run the demo federation (SST-2, 4 clients, 3 rounds); any setting can be changed."
    )(demo_command)
    from fedprompt.worker.train_local import train_local_command

    # the same command as `fedprompt-worker train-local`, for the operator who runs the demo
    app.command(
        "train-local",
        help="Centralised prompt tuning on a whole data set (the baseline; as fedprompt-worker's).",
    )(train_local_command)
    from fedprompt.sim.experiments.cli import app as experiment_app

    app.add_typer(experiment_app, name="experiment")


def _register_data() -> None:
    from fedprompt.sim.data_cli import data_app

    app.add_typer(data_app, name="data")


def register_all() -> None:
    """Add the commands whose imports are heavy or optional (simulate, experiment, data), once."""
    if any(c.name == "simulate" for c in app.registered_commands):
        return
    _register_simulate()
    _register_data()


def main() -> None:
    """Console entry point."""
    register_all()
    app()
