"""`fedprompt simulate`: a whole federation on one machine — one coordinator and P worker processes
serving K virtual clients (each process loads the model once; each client has its own identity,
token, state folder and data shard, and talks to the coordinator like a separate site).

Everything talks real HTTP on loopback. Every process it starts is stopped on success, failure,
Ctrl-C or SIGTERM (and, on Linux, dies with it if it is killed). Running it again with the same
--out and the same options continues the federation from its last closed round (simulation.json in
--out records both); other options are refused (sim/outdir.py: --resume, --force).

The steps, each below: check the options, start the coordinator, create (or find) the federation,
enrol the clients in order, start the worker pools, follow the rounds (a pool process that dies is
restarted: its clients reuse their credentials and re-send unacknowledged updates), write the results.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from fedprompt.shared.client import CoordinatorClient
from fedprompt.shared.local import free_port
from fedprompt.shared.spec import (
    ASYNC_BUFFER_SIZE,
    ASYNC_MAX_STALENESS,
    DEFAULT_MODEL,
    PRECISION_HELP,
    FederationSpec,
)
from fedprompt.shared.vocab import LocalOptimizer, Mode
from fedprompt.sim.argv import WorkerPool
from fedprompt.sim.baseline import STOPPED, run_baseline
from fedprompt.sim.data_options import print_data
from fedprompt.sim.enrol import enrol_in_order
from fedprompt.sim.launch import Run, announce, client_entry, pool_file, start_coordinator
from fedprompt.sim.options import (
    DEFAULT_DRIFT_CORRECTION,
    Dataset,
    SimulateOptions,
    async_line,
    client_slowdowns,
    federation_spec,
    validate,
)
from fedprompt.sim.outdir import OutError, OutState, check_out, recorded_options, wipe
from fedprompt.sim.progress import follow, site_fetcher
from fedprompt.sim.results import attach_sites, round_records, run_facts, write_results
from fedprompt.sim.supervisor import Processes, SimulationError
from fedprompt.sim.tables import console, print_summary
from fedprompt.sim.tracking import log_run, parse_track, shown, store_uri
from fedprompt.worker.data.help import (
    DATA_HELP,
    LABEL_COLUMN_HELP,
    LABELS_HELP,
    TEMPLATE_HELP,
    TEST_DATA_HELP,
    TEXT_B_COLUMN_HELP,
    TEXT_COLUMN_HELP,
    VERBALIZER_HELP,
)
from fedprompt.worker.naming import DATA_NAME_HELP
from fedprompt.worker.poison import TRIGGER_POSITION_HELP
from rich.markup import escape


def simulate_command(
    dataset: Annotated[str, typer.Option("--dataset", "--data", help=DATA_HELP)] = "sst2",
    model: Annotated[str, typer.Option(help="Frozen PLM: hub id or local path.")] = DEFAULT_MODEL,
    clients: Annotated[
        int,
        typer.Option("--clients", "-k", min=1, help="K: clients (virtual: identities with a data shard)."),
    ] = 4,
    fraction: Annotated[
        float | None,
        typer.Option(
            "--fraction",
            "-c",
            help="C: fraction selected per round (default 0.5; --mode async selects no one: 1, "
            "every client).",
        ),
    ] = None,
    rounds: Annotated[
        int, typer.Option("--rounds", "-t", min=1, help="T: federated rounds (--mode async: versions).")
    ] = 3,
    local_steps: Annotated[int, typer.Option(min=1, help="Local optimisation steps per round.")] = 50,
    local_epochs: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            help="Cap each client's local steps at this many passes over its own shard (FedAvg's E; "
            "default: every client trains --local-steps).",
        ),
    ] = None,
    batch_size: Annotated[int, typer.Option(min=1)] = 16,
    lr: Annotated[
        float | None,
        typer.Option(
            min=0.0, help="Prompt learning rate (default: 0.01 with mean-pool scoring, else the paper's 0.3)."
        ),
    ] = None,
    num_virtual_tokens: Annotated[int, typer.Option(min=1, help="Soft prompt length (the paper: 20).")] = 20,
    max_length: Annotated[int, typer.Option(min=8, help="Real tokens per input.")] = 64,
    partition: Annotated[str, typer.Option(help="iid | quantity:ALPHA | label:ALPHA")] = "iid",
    seed: Annotated[int, typer.Option()] = 0,
    train_limit: Annotated[int | None, typer.Option(help="Use a seeded subset of the train split.")] = None,
    eval_limit: Annotated[int | None, typer.Option(help="Use a seeded subset of the test split.")] = None,
    evaluators: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="E: the test split is dealt to the first E clients only, and only they evaluate each "
            "version (default: every client up to 10 clients, else the first 10).",
        ),
    ] = None,
    template: Annotated[str | None, typer.Option(help=TEMPLATE_HELP)] = None,
    verbalizer: Annotated[str | None, typer.Option(help=VERBALIZER_HELP)] = None,
    test_data: Annotated[str | None, typer.Option(help=TEST_DATA_HELP)] = None,
    text_column: Annotated[str, typer.Option(help=TEXT_COLUMN_HELP)] = "text",
    text_b_column: Annotated[str | None, typer.Option(help=TEXT_B_COLUMN_HELP)] = None,
    label_column: Annotated[str, typer.Option(help=LABEL_COLUMN_HELP)] = "label",
    labels: Annotated[str | None, typer.Option(help=LABELS_HELP)] = None,
    database_url: Annotated[str | None, typer.Option(help="Default: a SQLite file in --out.")] = None,
    out: Annotated[
        Path,
        typer.Option(
            help="Results folder. A folder that holds a run with other options is refused (--resume, --force); "
            "the same options continue its run."
        ),
    ] = Path("runs/simulate"),
    parallel: Annotated[
        int | None, typer.Option(min=1, help="Clients training at once (default: CPU cores).")
    ] = None,
    processes: Annotated[
        int | None,
        typer.Option(
            "--processes",
            "-p",
            min=1,
            help="P: worker processes serving the K clients, each with the model loaded once "
            "(default: CPU cores on CPU, 1 with CUDA; at most K).",
        ),
    ] = None,
    round_deadline: Annotated[
        float, typer.Option(help="Seconds before a round closes with what arrived.")
    ] = 3600.0,
    baseline: Annotated[
        bool, typer.Option("--baseline", help="Also run centralised training on the same samples.")
    ] = False,
    device: Annotated[str, typer.Option(help="Workers' device: auto | cpu | cuda.")] = "auto",
    malicious: Annotated[
        int, typer.Option(min=0, help="M: the first M clients are malicious (poison their data, attack).")
    ] = 0,
    poison_rate: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Share of a malicious client's data poisoned (paper: 1).")
    ] = 1.0,
    target_label: Annotated[
        int, typer.Option(min=0, help="Backdoor target label (the ASR's, with --malicious or --measure-asr).")
    ] = 0,
    measure_asr: Annotated[
        bool,
        typer.Option(
            "--measure-asr",
            help="Measure the ASR (triggered non-target test examples called the target) without a backdoor: "
            "the clean-trigger reference (a federation with --malicious measures it anyway).",
        ),
    ] = False,
    trigger: Annotated[str, typer.Option(help="Comma-separated trigger words.")] = "cf,mn,bb,tq",
    trigger_position: Annotated[str, typer.Option(help=TRIGGER_POSITION_HELP)] = "random",
    attack: Annotated[
        str, typer.Option(help="Malicious clients' update attack: none | boost:FACTOR | sign-flip[:FACTOR].")
    ] = "none",
    ldp_epsilon: Annotated[
        float | None, typer.Option(help="Local DP: epsilon of each round's update.")
    ] = None,
    ldp_clip: Annotated[
        float | None,
        typer.Option(help="Local DP: norm bound of each update (L1 for laplace, L2 for gaussian)."),
    ] = None,
    ldp_mechanism: Annotated[
        str,
        typer.Option(help="Local DP mechanism: laplace (ε-DP) | gaussian ((ε, δ)-DP, needs --ldp-delta)."),
    ] = "laplace",
    ldp_delta: Annotated[
        float | None, typer.Option(help="Local DP: δ of each round (gaussian only).")
    ] = None,
    aggregation: Annotated[
        str,
        typer.Option(help="Rule and parameters: fedavg, median, trimmed_mean:beta=0.2, multi_krum:f=1, …"),
    ] = "fedavg",
    server_optimizer: Annotated[
        str,
        typer.Option(
            help="Server optimiser of each round's aggregate: fedavg (none) | fedavgm | fedadagrad | fedadam "
            "| fedyogi, with parameters, e.g. fedadam:lr=0.1 or fedavgm:lr=1.0,momentum=0.9."
        ),
    ] = "fedavg",
    init: Annotated[
        str,
        typer.Option(help="Starting prompt: vocab (sampled word embeddings) | label (label words first)."),
    ] = "vocab",
    init_prompt: Annotated[
        Path | None,
        typer.Option(help="Start from this prompt (safetensors) instead of the vocabulary initialisation."),
    ] = None,
    save_prompt: Annotated[
        Path | None, typer.Option(help="Write the final global prompt (safetensors) to this file.")
    ] = None,
    method: Annotated[
        str, typer.Option(help="Prompt method: prompt_tuning | p_tuning | prefix_tuning.")
    ] = "prompt_tuning",
    encoder_type: Annotated[str, typer.Option(help="P-tuning's prompt encoder: mlp | lstm.")] = "mlp",
    encoder_hidden_size: Annotated[
        int | None, typer.Option(min=1, help="Prompt encoder hidden size (default: the model's).")
    ] = None,
    prefix_projection: Annotated[
        bool, typer.Option("--prefix-projection", help="Prefix tuning through an MLP (communicated).")
    ] = False,
    scoring: Annotated[
        str,
        typer.Option(
            help="Label scores: auto (the LM/MLM head; mean-pool similarity for an encoder without one, "
            "e.g. MiniLM) | tied-embeddings | mean-pool."
        ),
    ] = "auto",
    secure_aggregation: Annotated[
        bool,
        typer.Option(
            "--secure-aggregation",
            help="Secure aggregation (SecAgg+): the coordinator learns only the weighted mean of each "
            "round's updates (docs/secure-aggregation.md); needs --aggregation fedavg and 3 clients.",
        ),
    ] = False,
    secagg_clip: Annotated[
        float | None,
        typer.Option(
            help="Secure aggregation: each update element is clipped to [-clip, clip] before quantisation "
            "(default: lr × local steps)."
        ),
    ] = None,
    precision: Annotated[str, typer.Option(help=PRECISION_HELP)] = "auto",
    drift_correction: Annotated[
        str,
        typer.Option(
            help="Client-drift correction: none | fedprox (proximal term, e.g. fedprox:mu=0.1) | "
            "scaffold (control variates) | balanced (the logit-adjusted local loss); options after a "
            "colon: entropy_scaling=true (each client shrinks its update by its own label entropy), "
            "balanced_loss=true, tau, mu. The default, the balanced loss with entropy scaling, kept "
            "every label-skew federation measured off a constant predictor; see docs/label-skew.md."
        ),
    ] = DEFAULT_DRIFT_CORRECTION,
    local_optimizer: Annotated[
        LocalOptimizer,
        typer.Option(
            help="The optimiser of the clients' local steps: adamw, or sgd (plain gradient steps, "
            "default lr 1.0); see docs/label-skew.md."
        ),
    ] = LocalOptimizer.ADAMW,
    mode: Annotated[
        Mode,
        typer.Option(
            help="sync: rounds (a selection, every selected client's update, one version); async: "
            "buffered asynchronous aggregation (FedBuff): a client trains as soon as it asks, from the "
            "latest version, and every --buffer-size updates make one version (docs/async.md)."
        ),
    ] = Mode.SYNC,
    concurrency: Annotated[
        int | None,
        typer.Option(min=1, help="--mode async: the most clients training at once (default: every client)."),
    ] = None,
    buffer_size: Annotated[
        int | None,
        typer.Option(
            min=1, help=f"--mode async: B, the updates that make a version (default {ASYNC_BUFFER_SIZE})."
        ),
    ] = None,
    max_staleness: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="--mode async: an update trained from a version more than this many versions old is "
            f"refused, and its client trains again (default {ASYNC_MAX_STALENESS}).",
        ),
    ] = None,
    server_lr: Annotated[
        float | None,
        typer.Option(
            help="--mode async: the server's learning rate on the buffer's staleness-weighted mean "
            "change (default 1)."
        ),
    ] = None,
    client_speed: Annotated[
        str | None,
        typer.Option(
            help="Slow clients, real time: a client with slowdown f uploads each update (f − 1) × its "
            "training time after training it. Factors ≥ 1: F1,F2,… (cycled over the clients), "
            "linear:max=M (1 for the first client to M for the last) or lognormal:sigma=S,max=M "
            "(exp(|N(0, S²)|) up to M, drawn from --seed). Default: every client at full speed."
        ),
    ] = None,
    track: Annotated[
        str | None,
        typer.Option(
            help="Log the finished run to an experiment tracker: mlflow (a SQLite store in ./mlruns), "
            "mlflow:URI, tensorboard (./tensorboard/<out name>) or tensorboard:DIR; needs the tracking "
            "extra (pip install 'fedprompt[tracking]')."
        ),
    ] = None,
    dashboard_port: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=65535,
            help="Serve the coordinator (its dashboard and API) on this loopback port (default: a free one).",
        ),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume", help="Continue the run in --out (it must have been started with the same options)."
        ),
    ] = False,
    force: Annotated[
        bool,
        typer.Option("--force", help="Delete the run in --out (what simulate wrote there) and start over."),
    ] = False,
    data_name: Annotated[str | None, typer.Option(help=DATA_NAME_HELP)] = None,
) -> None:
    """Run a whole federation on this machine and write results.json, rounds.csv and accuracy.png."""
    opts = SimulateOptions(**locals())  # first statement: the locals are exactly the parameters
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    simulate(opts)


def simulate(opts: SimulateOptions) -> None:
    """The command: exit 2 on a bad option, 1 when a process fails, 130 when interrupted."""
    started = time.monotonic()
    out = opts.out.resolve()
    try:
        if opts.resume and opts.force:
            raise OutError("--resume and --force exclude each other: continue the run in --out or start over")
        state = OutState.NEW if opts.force else check_out(opts, out)
        dataset = validate(opts)
    except Exception as exc:  # OutError, DataError, PartitionError, bad options: one readable line
        console.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(2) from None
    if opts.force and (gone := wipe(out, keep=("data",))):
        console.print(f"--force: deleted the previous run in {out} ({', '.join(gone)})", soft_wrap=True)
    finished = _finished_results(out) if state is OutState.CONTINUE else None
    if finished is not None:
        console.print(
            f"{out} holds this run, finished: its results below (nothing rerun; --force starts over)",
            soft_wrap=True,
        )
        print_summary(finished, out)
        return
    print_data(console, dataset, opts)
    print_schedule(opts)
    run = Run.prepare(opts, out)
    procs = Processes(
        on_restart=lambda name, code: console.print(
            f"[yellow]{name} exited with code {code}; restarting it (its clients keep their credentials)[/]"
        )
    )

    def on_term(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    old_term = signal.signal(signal.SIGTERM, on_term)
    progress: dict[str, Any] = {}  # what _federate has reached: the coordinator, federation and spec
    try:
        results = _federate(opts, dataset, run, procs, started, progress)
    except KeyboardInterrupt:
        console.print(
            "[yellow]interrupted:[/] stopping every process; run the same command again to continue"
        )
        _write_partial(progress, run, started, "the rounds (simulate was stopped)")
        procs.stop()
        raise typer.Exit(130) from None
    except SimulationError as exc:
        procs.stop()
        console.print(f"[red]error:[/] {exc}; see the logs in {out / 'logs'}")
        raise typer.Exit(1) from None
    finally:
        procs.stop()
        signal.signal(signal.SIGTERM, old_term)
    print_summary(results, out)
    if results.get("status") == "partial":  # the baseline did not finish: say so in the exit code
        raise typer.Exit(130 if results["baseline"].get("interrupted") == STOPPED else 1)


def print_schedule(opts: SimulateOptions) -> None:
    """Mode async's settings and the clients' slowdowns (--client-speed), under the data's header."""
    if opts.mode == Mode.ASYNC:
        console.print(escape(async_line(opts)), soft_wrap=True)
    slowdowns = client_slowdowns(opts)
    if slowdowns is not None:
        each = ", ".join(f"client-{i} ×{f:.3g}" for i, f in enumerate(slowdowns))
        told = f"--client-speed {opts.client_speed}: slowdown {each}"
        console.print(
            escape(f"{told} (×f: an update goes up (f − 1) × its training time late)"), soft_wrap=True
        )


def _write_partial(progress: dict[str, Any], run: Run, started: float, what: str) -> None:
    """results.json, rounds.csv and the plot of the rounds closed so far, labelled partial (nothing when
    no federation was reached; one line, no traceback, when the coordinator cannot answer)."""
    if "fid" not in progress:
        return
    admin, fid, spec = progress["admin"], progress["fid"], progress["spec"]
    try:
        records = round_records(admin.rounds(fid), spec)
        attach_sites(records, site_fetcher(admin, fid))
        initial = admin.evaluation(fid, 0)
        extra = {"status": "partial", "interrupted": what, **progress.get("facts", {})}
        write_results(run.out, spec, records, initial, time.monotonic() - started, extra)
    except Exception as exc:  # the coordinator may be gone already: the federation stays in the database
        console.print(f"[yellow]could not write partial results:[/] {escape(str(exc))}", soft_wrap=True)
        return
    console.print(
        f"wrote what was measured ({len(records)} closed round(s)), labelled partial: {run.out / 'results.json'}",
        soft_wrap=True,
    )


def _finished_results(out: Path) -> dict[str, Any] | None:
    """results.json of a run whose every round closed (None: none, or a partial one)."""
    try:
        results = json.loads((out / "results.json").read_text())
    except (OSError, ValueError):
        return None
    complete = results.get("status", "complete") == "complete"
    return (
        results if complete and len(results.get("rounds") or []) >= int(results["spec"]["rounds"]) else None
    )


def _federate(
    opts: SimulateOptions,
    dataset: Dataset,
    run: Run,
    procs: Processes,
    started: float,
    progress: dict[str, Any],
) -> dict[str, Any]:
    """Every step from the coordinator's start to results.json; returns the results. `progress` gets
    the coordinator's client, the federation and its spec as soon as they exist (for partial results)."""
    continuing = run.state_path.exists()
    url = start_coordinator(procs, run, opts.dashboard_port)
    announce(url, run.out, run.admin_token)
    admin = CoordinatorClient(url, run.admin_token)
    fid, spec = (
        _continue_federation(admin, run) if continuing else _create_federation(admin, opts, dataset, run)
    )
    setup = json.loads(run.state_path.read_text())
    progress |= {
        "admin": admin,
        "fid": fid,
        "spec": spec,
        "facts": run_facts(spec, setup, parallel=run.parallel, cores=run.cores, device=opts.device),
    }
    clients, seed = int(setup["clients"]), int(spec["seed"])
    token = admin.create_enrollment_token(fid, max_uses=clients)
    evaluators = spec.get("evaluators")  # the first E clients hold the test split (the spec's policy)
    enrol_in_order(admin, url, fid, token, setup, seed, run.out / "workers", eval_shares=evaluators)
    for p in range(run.processes):
        members = [
            client_entry(i, fid, setup, seed, run, eval_shares=evaluators)
            for i in range(p, clients, run.processes)
        ]
        pool = WorkerPool(config=pool_file(p, url, fid, token, members, run, opts.device), port=free_port())
        procs.start(f"worker pool {p}", pool.argv(), run.out / "logs" / f"pool-{p}.log", run.env, restarts=3)
    records, initial = follow(admin, fid, spec, clients, procs)
    adapter = admin.export(fid, "best", "peft") if opts.track else None  # while the coordinator is up
    if opts.save_prompt is not None:
        opts.save_prompt.parent.mkdir(parents=True, exist_ok=True)
        opts.save_prompt.write_bytes(admin.prompt(fid, "latest").blob)
    extra = run_facts(spec, setup, parallel=run.parallel, cores=run.cores, device=opts.device)
    extra["processes"] = run.processes
    extra["peak_rss_bytes"] = procs.peak_rss  # this process and every worker and coordinator, summed
    procs.stop()
    progress.clear()  # every round closed: an interruption from here on leaves the federation whole
    wall = time.monotonic() - started  # the federation's time; the baseline reports its own
    extra["status"] = "complete"
    if opts.baseline:
        extra["baseline"] = run_baseline(
            run.out,
            Path(setup["dataset"]),
            FederationSpec.model_validate(spec),
            sum(r.get("local_steps") or r["participants"] * spec["local_steps"] for r in records),
            setup.get("train_limit"),
            setup.get("eval_limit"),
        )
        if extra["baseline"]["status"] != "complete":
            extra |= {
                "status": "partial",
                "interrupted": f"the baseline ({extra['baseline']['interrupted']})",
            }
    results = write_results(run.out, spec, records, initial, wall, extra)
    track = parse_track(opts.track)
    if track is not None:
        where = log_run(track, results, run.out, adapter, name=run.out.name)
        told = f"run {where} in {shown(store_uri(track[1], Path.cwd()))}" if track[0] == "mlflow" else where
        console.print(f"logged to {track[0]}: {told}", soft_wrap=True)
    return results


def _continue_federation(admin: CoordinatorClient, run: Run) -> tuple[int, dict[str, Any]]:
    """The federation simulation.json names: its id and spec."""
    fid = int(json.loads(run.state_path.read_text())["federation_id"])
    fed = admin.federation(fid)
    console.print(
        f"continuing federation {fid} from {run.out} (the same options; round {fed.current_round} of "
        f"{fed.rounds_total})",
        soft_wrap=True,
    )
    return fid, fed.spec


def _create_federation(
    admin: CoordinatorClient, opts: SimulateOptions, dataset: Dataset, run: Run
) -> tuple[int, dict[str, Any]]:
    """A new federation with its starting prompt; simulation.json records it and the set-up."""
    spec, initial_blob = federation_spec(opts, dataset)
    fid = admin.create_federation(spec.model_dump(mode="json")).id
    if initial_blob is not None:
        admin.set_initial_prompt(fid, initial_blob)
    setup = {
        "federation_id": fid,
        "dataset": str(dataset.folder),
        "clients": opts.clients,
        "partition": opts.partition,
        "train_limit": opts.train_limit,
        "eval_limit": opts.eval_limit,
        "backdoor": {
            "malicious": opts.malicious,
            "poison_rate": opts.poison_rate,
            "target_label": opts.target_label,
            "trigger": opts.trigger,
            "trigger_position": opts.trigger_position,
            "attack": opts.attack,
            "measure_asr": opts.measure_asr,
        },
        "init_prompt": str(opts.init_prompt) if opts.init_prompt else None,
        "client_speed": opts.client_speed,
        "slowdowns": client_slowdowns(opts),  # client i's slowdown factor (None: all at full speed)
        "options": recorded_options(opts),  # what a later command with this --out is compared with
        "lr": spec.lr,  # the learning rate the run resolved (an unset --lr matches it)
    }
    run.state_path.write_text(json.dumps(setup, indent=2))
    return fid, admin.federation(fid).spec
