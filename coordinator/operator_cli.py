"""fedprompt: the operator's CLI over the coordinator's REST API (and `simulate`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from shared.client import ApiError, CoordinatorClient

app = typer.Typer(help="fedprompt: operate federated prompt tuning.", no_args_is_help=True)
federation_app = typer.Typer(help="Create and inspect federations.", no_args_is_help=True)
token_app = typer.Typer(help="Enrolment tokens.", no_args_is_help=True)
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

console = Console()
err = Console(stderr=True)

UrlOpt = Annotated[str, typer.Option("--url", envvar="FEDPROMPT_URL", help="Coordinator base URL.")]
TokenOpt = Annotated[
    str | None,
    typer.Option("--token", envvar="FEDPROMPT_ADMIN_TOKEN", help="Admin token.", show_default=False),
]
FedOpt = Annotated[int, typer.Option("--federation", "-f", help="Federation id.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable JSON output.")]
DEFAULT_URL = "http://127.0.0.1:8000"


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


def _emit(data: Any, as_json: bool, render: Any = None) -> None:
    if as_json or render is None:
        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    else:
        render(data)


def _fmt(v: Any, digits: int = 4) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _status_table(feds: list[dict[str, Any]]) -> None:
    table = Table(title="federations")
    for col in ("id", "name", "state", "round", "clients", "latest version", "accuracy"):
        table.add_column(col)
    for f in feds:
        latest = (f.get("latest") or {}).get("evaluation") or {}
        table.add_row(
            str(f["id"]),
            f["name"],
            f["state"] + (" (paused)" if f["paused"] and f["state"] != "paused" else ""),
            f"{f['current_round']}/{f['rounds_total']}",
            f"{f['clients']['available']}/{f['clients']['enrolled']}",
            str(f["latest_version"]),
            _fmt(latest.get("accuracy")),
        )
    console.print(table)


def _rounds_table(rounds: list[dict[str, Any]]) -> None:
    table = Table(title="rounds")
    for col in (
        "round",
        "attempt",
        "state",
        "participants",
        "uploaded",
        "accuracy",
        "train loss",
        "bytes up",
        "s",
    ):
        table.add_column(col)
    for r in rounds:
        ev = r.get("evaluation") or {}
        table.add_row(
            str(r["round"]),
            str(r["attempt"]),
            r["state"],
            str(len(r["participants"])),
            str(sum(p["uploaded"] for p in r["participants"])),
            _fmt(ev.get("accuracy")),
            _fmt(r["stats"].get("train_loss")),
            _fmt(r["stats"].get("bytes_up")),
            _fmt(r.get("seconds"), 1),
        )
    console.print(table)


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
        fed = _run(c.create_federation, body)
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
        feds = _run(c.federations) if federation is None else [_run(c.federation, federation)]
    _emit(feds if federation is None else feds[0], as_json, lambda _: _status_table(feds))


@federation_app.command("pause")
def federation_pause(federation: FedOpt, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Stop opening rounds automatically."""
    with _client(url, token) as c:
        _run(c.pause, federation)
    console.print(f"federation {federation} paused")


@federation_app.command("resume")
def federation_resume(federation: FedOpt, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Open rounds automatically again."""
    with _client(url, token) as c:
        _run(c.resume, federation)
    console.print(f"federation {federation} resumed")


@token_app.command("create")
def token_create(
    federation: FedOpt,
    expires_in: Annotated[float | None, typer.Option(help="Seconds until it expires.")] = None,
    max_uses: Annotated[int | None, typer.Option(help="How many enrolments it allows.")] = None,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Issue an enrolment token (printed once)."""
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
        console.print(table)

    _emit(rows, as_json, render)


@clients_app.command("revoke")
def clients_revoke(
    federation: FedOpt,
    client: Annotated[int, typer.Argument(help="Client id.")],
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Revoke a client."""
    with _client(url, token) as c:
        _run(c.revoke_client, federation, client)
    console.print(f"client {client} revoked")


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


@rounds_app.command("list")
def rounds_list(
    federation: FedOpt, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """Round history."""
    with _client(url, token) as c:
        rows = _run(c.rounds, federation)
    _emit(rows, as_json, _rounds_table)


@prompt_app.command("get")
def prompt_get(
    federation: FedOpt,
    out: Annotated[Path, typer.Option("--out", help="Where to write the safetensors file.")],
    version: Annotated[str, typer.Option("--version", help="Version number or 'latest'.")] = "latest",
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Download a global prompt version as safetensors."""
    from shared import wire

    with _client(url, token) as c:
        prompt = _run(c.prompt, federation, version)
    if wire.sha256(prompt.blob) != prompt.sha256:
        err.print("[red]error:[/] download corrupted (sha256 mismatch); try again")
        raise typer.Exit(1)
    out.write_bytes(prompt.blob)
    console.print(
        f"prompt version {prompt.version} ({len(prompt.blob)} bytes, sha256 {prompt.sha256[:12]}…) → {out}"
    )


def _register_simulate() -> None:
    import importlib.util

    if importlib.util.find_spec("torch") is None:  # a coordinator-only install has no worker extra
        return
    from worker.simulate import simulate_command

    app.command(
        "simulate", help="Run a whole federation on this machine (coordinator + K worker processes)."
    )(simulate_command)


def main() -> None:
    """Console entry point."""
    _register_simulate()
    app()
