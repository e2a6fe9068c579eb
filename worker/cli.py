"""fedprompt-worker: the worker service and centralised training."""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path
from typing import Annotated

import typer
from fedprompt.shared.logs import LogFormatOption
from fedprompt.worker.data.help import (
    DATA_HELP,
    LABEL_COLUMN_HELP,
    LABELS_HELP,
    TEST_DATA_HELP,
    TEXT_B_COLUMN_HELP,
    TEXT_COLUMN_HELP,
)
from fedprompt.worker.poison import TRIGGER_POSITION_HELP
from fedprompt.worker.reach import DEFAULT_GIVE_UP_AFTER

from fedprompt.clikit import make_app

# Options both `serve` and `pool` take: the worker's own API and its logs.
HostOption = Annotated[
    str, typer.Option(envvar="FEDPROMPT_WORKER_HOST", help="Bind address of /healthz, /status, /metrics.")
]
PortOption = Annotated[
    int, typer.Option(envvar="FEDPROMPT_WORKER_PORT", help="Port of the worker's own API.")
]
LogLevelOption = Annotated[str, typer.Option(envvar="FEDPROMPT_LOG_LEVEL", help="Log level.")]
TokenFileOption = Annotated[
    Path | None,
    typer.Option(
        envvar="FEDPROMPT_WORKER_TOKEN_FILE",
        help="File holding the token the worker's own API asks for on every path but /healthz "
        "(or set FEDPROMPT_WORKER_TOKEN); needed to bind a non-loopback --host.",
    ),
]


def api_token(host: str, token_file: Path | None) -> str | None:
    """The worker API's token (FEDPROMPT_WORKER_TOKEN, or the file), or a one-line exit (2) when the
    API would be reachable from other machines without one."""
    token = os.environ.get("FEDPROMPT_WORKER_TOKEN") or None
    if token_file is not None:
        try:
            token = token_file.read_text().strip() or None
        except OSError as exc:
            typer.echo(f"error: cannot read the worker token file: {exc}", err=True)
            raise typer.Exit(2) from None
    if token is not None and len(token) < 16:
        typer.echo("error: FEDPROMPT_WORKER_TOKEN must be at least 16 characters", err=True)
        raise typer.Exit(2)
    if token is None and not _loopback(host):
        typer.echo(
            f"error: --host {host} exposes this worker's /status and /metrics to other machines: set "
            "FEDPROMPT_WORKER_TOKEN or FEDPROMPT_WORKER_TOKEN_FILE (a token of 16+ characters), or bind 127.0.0.1",
            err=True,
        )
        raise typer.Exit(2)
    return token


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


app = make_app(
    "fedprompt worker: trains a soft prompt locally against a frozen PLM.",
    aliases={
        "--num-threads": "--threads",
        "--enrolment-token": "--enrollment-token",
        "--enrolment-token-file": "--enrollment-token-file",
    },
)


@app.command()
def serve(
    coordinator: Annotated[str, typer.Option(envvar="FEDPROMPT_COORDINATOR", help="Coordinator base URL.")],
    federation: Annotated[int, typer.Option(envvar="FEDPROMPT_FEDERATION", help="Federation id.")],
    data: Annotated[str, typer.Option("--data", "--dataset", envvar="FEDPROMPT_DATA", help=DATA_HELP)],
    enrollment_token: Annotated[
        str | None, typer.Option(envvar="FEDPROMPT_ENROLLMENT_TOKEN", help="Needed only for the first start.")
    ] = None,
    enrollment_token_file: Annotated[
        Path | None,
        typer.Option(
            envvar="FEDPROMPT_ENROLLMENT_TOKEN_FILE",
            help="Read the enrollment token from this file (a mounted secret) instead.",
        ),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option(
            envvar="FEDPROMPT_WORKER_NAME", help="Client name shown to the operator (default: host name)."
        ),
    ] = None,
    state_dir: Annotated[
        Path, typer.Option(envvar="FEDPROMPT_STATE_DIR", help="Credentials and unacknowledged updates.")
    ] = Path("worker-state"),
    host: HostOption = "127.0.0.1",
    port: PortOption = 8100,
    token_file: TokenFileOption = None,
    partition: Annotated[
        str,
        typer.Option(envvar="FEDPROMPT_PARTITION", help="iid | quantity:ALPHA | label:ALPHA (simulation)."),
    ] = "iid",
    num_partitions: Annotated[
        int,
        typer.Option(
            envvar="FEDPROMPT_NUM_PARTITIONS", min=1, help="K: into how many parts the data is cut."
        ),
    ] = 1,
    partition_id: Annotated[
        int, typer.Option(envvar="FEDPROMPT_PARTITION_ID", min=0, help="Which part is this worker's.")
    ] = 0,
    seed: Annotated[int, typer.Option(envvar="FEDPROMPT_SEED", help="Seed of partitioning and limits.")] = 0,
    train_limit: Annotated[
        int | None, typer.Option(min=1, help="Use a seeded subset of the train split.")
    ] = None,
    eval_limit: Annotated[
        int | None, typer.Option(min=1, help="Use a seeded subset of the test split.")
    ] = None,
    eval_fraction: Annotated[
        float | None,
        typer.Option(help="Hold out this fraction of the shard for evaluation (default: test split)."),
    ] = None,
    test_data: Annotated[str | None, typer.Option(envvar="FEDPROMPT_TEST_DATA", help=TEST_DATA_HELP)] = None,
    text_column: Annotated[str, typer.Option(help=TEXT_COLUMN_HELP)] = "text",
    label_column: Annotated[str, typer.Option(help=LABEL_COLUMN_HELP)] = "label",
    text_b_column: Annotated[str | None, typer.Option(help=TEXT_B_COLUMN_HELP)] = None,
    labels: Annotated[str | None, typer.Option(help=LABELS_HELP)] = None,
    device: Annotated[
        str, typer.Option(envvar="FEDPROMPT_DEVICE", help="auto (CUDA when available) | cpu | cuda.")
    ] = "auto",
    threads: Annotated[
        int | None, typer.Option(envvar="FEDPROMPT_THREADS", min=1, help="CPU threads for torch.")
    ] = None,
    poll_wait: Annotated[float, typer.Option(help="Long-poll seconds per task request.")] = 20.0,
    give_up_after: Annotated[
        float,
        typer.Option(
            envvar="FEDPROMPT_GIVE_UP_AFTER",
            min=1.0,
            help="Exit (code 1, one line) when the coordinator stays unreachable this many seconds; "
            "meanwhile retry with backoff.",
        ),
    ] = DEFAULT_GIVE_UP_AFTER,
    slots_dir: Annotated[
        Path | None, typer.Option(help="Shared lock folder limiting concurrent training.")
    ] = None,
    slots: Annotated[int, typer.Option(help="How many workers sharing --slots-dir may train at once.")] = 0,
    target_label: Annotated[
        int | None,
        typer.Option(
            min=0, help="Backdoor target label id: measure ASR in every evaluation (and poison to it)."
        ),
    ] = None,
    poison_rate: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Malicious: poison this share of the training data.")
    ] = 0.0,
    trigger: Annotated[str, typer.Option(help="Comma-separated trigger words.")] = "cf,mn,bb,tq",
    trigger_position: Annotated[str, typer.Option(help=TRIGGER_POSITION_HELP)] = "random",
    attack: Annotated[
        str, typer.Option(help="Malicious update before upload: none | boost:FACTOR | sign-flip[:FACTOR].")
    ] = "none",
    slowdown: Annotated[
        float,
        typer.Option(
            min=1.0,
            help="Act as a site F times slower (simulation): upload each update (F − 1) × its training "
            "time after training it; 1: at once.",
        ),
    ] = 1.0,
    log_level: LogLevelOption = "info",
    log_format: LogFormatOption = "auto",
) -> None:
    """Enroll with the coordinator, then train and evaluate the global prompt on local data."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    token = api_token(host, token_file)
    from fedprompt.shared.logs import configure_logging

    client_name = name or f"{socket.gethostname()}-{partition_id}"
    try:
        # every line names the federation and the client; httpx is quieted (one line per poll)
        configure_logging(
            log_level, log_format, static={"federation_id": federation, "client_name": client_name}
        )
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    from fedprompt.worker.quiet import quiet_third_party

    quiet_third_party()  # no tqdm bars nor plain-text lines among the JSON ones
    import uvicorn
    from fedprompt.worker.agent import Agent, AgentConfig
    from fedprompt.worker.app import WorkerMetrics, create_app
    from fedprompt.worker.data import DataError, parse_labels
    from fedprompt.worker.poison import backdoor_from_options
    from fedprompt.worker.pool import Pool, SharedEngine
    from fedprompt.worker.reach import Unreachable, wait_reachable
    from fedprompt.worker.shards import ShardSpec, load_shard

    if enrollment_token_file is not None:
        try:
            enrollment_token = enrollment_token_file.read_text().strip() or None
        except OSError as exc:
            typer.echo(f"error: cannot read the enrollment token file: {exc}", err=True)
            raise typer.Exit(2) from None
        if enrollment_token is None:
            typer.echo(f"error: the enrollment token file {enrollment_token_file} is empty", err=True)
            raise typer.Exit(2)
    if threads:
        import torch

        torch.set_num_threads(threads)
    try:
        train, evaluation, full = load_shard(
            ShardSpec(
                data=data,
                test_data=test_data,
                partition=partition,
                num_partitions=num_partitions,
                partition_id=partition_id,
                seed=seed,
                train_limit=train_limit,
                eval_limit=eval_limit,
                eval_fraction=eval_fraction,
                text_column=text_column,
                label_column=label_column,
                text_b_column=text_b_column,
                label_names=parse_labels(labels),
            )
        )
        backdoor = backdoor_from_options(
            target_label, poison_rate, trigger, trigger_position, attack, full.num_labels, seed + partition_id
        )
    except (DataError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    agent = Agent(
        AgentConfig(
            coordinator=coordinator,
            federation_id=federation,
            enrollment_token=enrollment_token,
            name=client_name,
            state_dir=state_dir,
            device=device,
            poll_wait=poll_wait,
            slots_dir=slots_dir,
            slots=slots,
            num_threads=threads,
            backdoor=backdoor,
            slowdown=slowdown,
        ),
        train,
        evaluation,
        # a client restarted after an outage finds its model already loaded
        engine_factory=SharedEngine(),
    )
    try:
        wait_reachable(coordinator, give_up_after)
    except Unreachable as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    fatal: list[str] = []
    server: uvicorn.Server | None = None

    def on_fatal(message: str) -> None:
        fatal.append(message)
        if server is not None:
            server.should_exit = True

    pool = Pool([agent], give_up_after=give_up_after, on_fatal=on_fatal)
    config = uvicorn.Config(
        create_app(pool, WorkerMetrics(), token=token),
        host=host,
        port=port,
        log_level="warning",
        log_config=None,
    )
    server = uvicorn.Server(config)
    server.run()
    if fatal:
        typer.echo(f"error: {fatal[0]}", err=True)
        raise typer.Exit(1)


@app.command()
def pool(
    config: Annotated[
        Path,
        typer.Option("--config", envvar="FEDPROMPT_POOL", help="Pool file (JSON): the clients to serve."),
    ],
    host: HostOption = "127.0.0.1",
    port: PortOption = 8100,
    token_file: TokenFileOption = None,
    log_level: LogLevelOption = "info",
    log_format: LogFormatOption = "auto",
) -> None:
    """Serve several clients from one process: one model in memory, one identity and shard per client."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    token = api_token(host, token_file)
    from fedprompt.shared.logs import configure_logging
    from fedprompt.worker.data import DataError
    from fedprompt.worker.pool import PoolConfig, build_pool
    from fedprompt.worker.quiet import quiet_third_party
    from pydantic import ValidationError

    try:
        configure_logging(log_level, log_format)
        quiet_third_party()  # no tqdm bars nor plain-text lines among the JSON ones
        settings = PoolConfig.read(config)
        if settings.threads:
            import torch

            torch.set_num_threads(settings.threads)
        clients = build_pool(settings)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        typer.echo(f"error: {config}: {where}: {first['msg']}", err=True)
        raise typer.Exit(2) from None
    except (DataError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    import uvicorn
    from fedprompt.worker.app import WorkerMetrics, create_app

    uvicorn.run(
        create_app(clients, WorkerMetrics(), token=token),
        host=host,
        port=port,
        log_level="warning",
        log_config=None,
    )


def _register() -> None:
    """Add the commands whose imports are heavy (torch), once."""
    if any(c.name == "train-local" for c in app.registered_commands):
        return
    from fedprompt.worker.train_local import train_local_command

    app.command("train-local", help="Centralised prompt tuning on a whole data set (the baseline).")(
        train_local_command
    )


def main() -> None:
    """Console entry point."""
    _register()
    app()
