"""`fedprompt simulate`: a whole federation on one machine — one coordinator and K worker processes.

Everything talks real HTTP on loopback. Every process it starts is stopped on success, failure,
Ctrl-C or SIGTERM (and, on Linux, dies with it if it is killed). Running it again with the same
--out continues the federation from its last closed round.
"""

from __future__ import annotations

import csv
import ctypes
import json
import os
import platform
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from shared.client import ApiError, CoordinatorClient
from shared.local import free_port, wait_ready
from shared.methods import METHODS
from shared.spec import DEFAULT_MODEL, FederationSpec

# Written to a log (make demo's pipe, an experiment cell's simulate.log) the round table keeps its columns
# whole instead of folding them into 80 characters; $COLUMNS still wins where it is set.
console = Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 160)


class SimulationError(RuntimeError):
    """The simulation cannot go on; the message says why and where to look."""


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM if the simulate process dies (Linux prctl)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _bin(name: str) -> str:
    return str(Path(sys.executable).parent / name)


@dataclass
class Processes:
    """Every child process the simulation started, so all of them can be stopped."""

    procs: list[tuple[str, subprocess.Popen]] = field(default_factory=list)
    logs: list[Any] = field(default_factory=list)

    def start(self, name: str, args: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen:
        """Start a child with its output in a log file."""
        log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.logs.append(log)
        proc = subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=_die_with_parent,
            start_new_session=True,
        )
        self.procs.append((name, proc))
        return proc

    def check(self) -> None:
        """Raise if a child died."""
        for name, proc in self.procs:
            if proc.poll() is not None:
                raise SimulationError(f"{name} exited with code {proc.returncode}")

    def stop(self) -> None:
        """SIGTERM everyone, wait, SIGKILL stragglers."""
        for _, proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 20
        for _, proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in self.logs:
            log.close()


def resolve_dataset_arg(dataset: str) -> tuple[Path, str, str]:
    """(folder, name, task) of a data set name or folder."""
    from worker.data import resolve_dataset

    folder = resolve_dataset(dataset)
    meta = json.loads((folder / "meta.json").read_text())
    return folder, folder.name, meta.get("task", "single")


def parse_aggregation(text: str) -> dict[str, Any]:
    """'trimmed_mean:beta=0.2' or 'multi_krum:f=1,m=7' → {"name": ..., "params": {...}} (numbers parsed)."""
    name, _, rest = text.strip().partition(":")
    params: dict[str, Any] = {}
    for item in filter(None, (x.strip() for x in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"--aggregation {text!r}: parameters are key=value, e.g. trimmed_mean:beta=0.2")
        try:
            number = float(value)
        except ValueError:
            params[key.strip()] = value.strip()
            continue
        params[key.strip()] = int(number) if number.is_integer() and "." not in value else number
    if not name:
        raise ValueError("--aggregation needs a rule name, e.g. fedavg, median or trimmed_mean:beta=0.2")
    return {"name": name, "params": params}


def privacy_spec(
    mechanism: str, epsilon: float | None, clip: float | None, delta: float | None
) -> dict[str, Any] | None:
    """The federation's privacy block from the --ldp-* options (None: LDP off), validated by PrivacySpec."""
    from pydantic import ValidationError

    from shared.spec import PrivacySpec

    if epsilon is None and clip is None:
        if delta is not None or mechanism != "laplace":
            raise ValueError("--ldp-mechanism and --ldp-delta need --ldp-epsilon and --ldp-clip")
        return None
    if epsilon is None or clip is None:
        raise ValueError("--ldp-epsilon and --ldp-clip go together (the noise scales with clip / epsilon)")
    fields = {"mechanism": mechanism, "epsilon": epsilon, "clip": clip, "delta": delta}
    try:
        return PrivacySpec.model_validate(fields).model_dump()
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'ldp'}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"--ldp-* options: {problems}") from None


def _check_attack_options(
    *,
    clients: int,
    malicious: int,
    attack: str,
    trigger: str,
    trigger_position: str,
    ldp_epsilon: float | None,
    ldp_clip: float | None,
    ldp_mechanism: str,
    ldp_delta: float | None,
    aggregation: str,
) -> None:
    """Refuse bad backdoor, privacy and aggregation options before any process starts."""
    from coordinator.logic.aggregation import check_params
    from worker.poison import parse_attack, parse_trigger

    if not 0 <= malicious <= clients:
        raise ValueError(f"--malicious must be between 0 and --clients ({clients}); got {malicious}")
    parse_attack(attack)
    parse_trigger(trigger, trigger_position)
    privacy_spec(ldp_mechanism, ldp_epsilon, ldp_clip, ldp_delta)
    agg = parse_aggregation(aggregation)
    check_params(agg["name"], agg["params"])


def _check_options(*, partition: str, fraction: float, verbalizer: str | None) -> None:
    """Refuse bad options before any process starts."""
    from worker.data import parse_partition

    parse_partition(partition)
    if not 0 < fraction <= 1:
        raise ValueError(f"--fraction must be in (0, 1]; got {fraction}")
    if verbalizer is not None:
        try:
            value = json.loads(verbalizer)
        except json.JSONDecodeError as exc:
            raise ValueError(f'--verbalizer is not JSON ({exc.msg}); e.g. [["bad"], ["good"]]') from None
        if not isinstance(value, list) or not all(isinstance(w, list) and w for w in value):
            raise ValueError('--verbalizer must be a JSON list of lists of words, e.g. [["bad"], ["good"]]')


def build_spec(
    *,
    dataset_name: str,
    task: str,
    model: str,
    clients: int,
    fraction: float,
    rounds: int,
    local_steps: int,
    batch_size: int,
    lr: float,
    num_virtual_tokens: int,
    max_length: int,
    seed: int,
    round_deadline: float,
    template: str | None,
    verbalizer: list[list[str]] | None,
    hidden_size: int,
    fingerprint: str | None,
    aggregation: dict[str, Any] | None = None,
    privacy: dict[str, Any] | None = None,
    method: dict[str, Any] | None = None,
) -> FederationSpec:
    """The federation spec for a simulation (`method`: method, encoder and model-shape fields)."""
    from worker.data import preset_for

    preset = preset_for(dataset_name, task)
    return FederationSpec(
        name=f"simulate-{dataset_name}",
        model=model,
        model_fingerprint=fingerprint,
        num_virtual_tokens=num_virtual_tokens,
        hidden_size=hidden_size,
        template=template or preset.template,
        verbalizer=verbalizer or preset.verbalizer,
        max_length=max_length,
        rounds=rounds,
        fraction=fraction,
        min_clients=1,
        expected_clients=clients,
        quorum=1,
        round_deadline_s=round_deadline,
        availability_timeout_s=max(3600.0, round_deadline),
        local_steps=local_steps,
        batch_size=batch_size,
        lr=lr,
        seed=seed,
        aggregation=aggregation or {"name": "fedavg", "params": {}},
        privacy=privacy,
        **(method or {}),
    )


def ledger_fields(spec: dict[str, Any] | None) -> dict[str, Any]:
    """params_communicated (per client and direction), params_full_model and comm_ratio of a spec."""
    if spec is None:
        return {}
    parsed = FederationSpec.model_validate(spec)
    sent, full = parsed.params_communicated(), parsed.params_full_model
    return {
        "params_communicated": sent,
        "params_full_model": full,
        "comm_ratio": sent / full if full else None,
    }


def round_records(rounds: list[dict[str, Any]], spec: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One record per closed round, in the shape results.json promises."""
    ledger = ledger_fields(spec)
    out = []
    for r in rounds:
        if r["state"] != "closed":
            continue
        ev = r.get("evaluation") or {}
        stats = r["stats"]
        out.append(
            {
                "round": r["round"],
                "attempt": r["attempt"],
                "participants": stats.get("participants", len(r["participants"])),
                "accuracy": ev.get("accuracy"),
                "eval_loss": ev.get("loss"),
                "eval_clients": ev.get("clients", 0),
                "eval_samples": ev.get("num_samples", 0),
                "loss": stats.get("train_loss"),
                "bytes_up": stats.get("bytes_up", 0),
                "bytes_down": stats.get("bytes_down", 0),
                "seconds": r.get("seconds"),
                "asr": ev.get("asr"),
                "local_asr": _mean(list((stats.get("local_asr") or {}).values())),
                "local_asr_clients": stats.get("local_asr") or {},
                "epsilon": (stats.get("privacy") or {}).get("epsilon"),
                "epsilon_cumulative": (stats.get("privacy") or {}).get("max_cumulative_epsilon"),
                "notes": stats.get("notes") or {},
                **ledger,
                "params_up": ledger.get("params_communicated", 0) * stats.get("updates", 0),
                "params_down": ledger.get("params_communicated", 0) * stats.get("participants", 0),
            }
        )
    return out


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def write_results(
    out: Path,
    spec: dict[str, Any],
    records: list[dict[str, Any]],
    initial: dict[str, Any] | None,
    wall: float,
    extra: dict[str, Any],
) -> dict[str, Any]:
    """results.json, rounds.csv and accuracy.png in `out`."""
    results = {
        "spec": spec,
        "rounds": records,
        "initial_accuracy": (initial or {}).get("accuracy"),
        "final_accuracy": records[-1]["accuracy"] if records else None,
        "initial_asr": (initial or {}).get("asr"),
        "final_asr": records[-1].get("asr") if records else None,
        "total_bytes_up": sum(r["bytes_up"] for r in records),
        "total_bytes_down": sum(r["bytes_down"] for r in records),
        "wall_seconds": wall,
        **extra,
    }
    (out / "results.json").write_text(json.dumps(results, indent=2))
    fields = ["round", "participants", "accuracy", "loss", "eval_loss", "bytes_up", "bytes_down", "seconds"]
    fields += ["asr", "local_asr", "epsilon", "epsilon_cumulative"]
    with open(out / "rounds.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(records)
    plot_accuracy(out / "accuracy.png", results)
    if results["initial_asr"] is not None or any(r.get("asr") is not None for r in records):
        from sim.experiments.plots import plot_asr

        plot_asr(out / "asr.png", results)
    return results


def plot_accuracy(path: Path, results: dict[str, Any]) -> None:
    """Global test accuracy per round (round 0: the initial prompt), with the baseline if any."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    xs, ys = [], []
    if results.get("initial_accuracy") is not None:
        xs.append(0)
        ys.append(results["initial_accuracy"])
    for r in results["rounds"]:
        if r["accuracy"] is not None:
            xs.append(r["round"])
            ys.append(r["accuracy"])
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    spec = results["spec"]
    ax.plot(
        xs,
        [100 * y for y in ys],
        marker="o",
        label=f"federated (K={results.get('clients')}, C={spec['fraction']}, {results.get('partition', 'iid')})",
    )
    baseline = results.get("baseline")
    if baseline and baseline.get("accuracy") is not None:
        ax.axhline(
            100 * baseline["accuracy"], color="tab:red", linestyle="--", label="centralised, same samples"
        )
        ax.set_ylim(top=max(ax.get_ylim()[1], 100 * baseline["accuracy"] + 2))  # keep the line off the frame
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"{results.get('dataset', '')} · {spec['model'].split('/')[-1]} · prompt tuning")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _fmt(v: Any, pct: bool = False) -> str:
    if v is None:
        return "-"
    return f"{100 * v:.1f}" if pct else (f"{v:.4f}" if isinstance(v, float) else str(v))


def _row_table(record: dict[str, Any], header: bool) -> Table:
    table = Table(show_header=header, box=None, pad_edge=False)
    for col, width in [
        ("round", 5),
        ("clients", 7),
        ("accuracy %", 10),
        ("train loss", 10),
        ("up", 10),
        ("down", 10),
        ("s", 6),
        ("ASR %", 6),
        ("local ASR %", 11),
        ("ε total", 8),
        ("params/client (of model)", 24),
    ]:
        table.add_column(col, width=width, justify="right")
    eps = record.get("epsilon_cumulative")
    table.add_row(
        str(record["round"]),
        str(record["participants"]),
        _fmt(record["accuracy"], pct=True),
        _fmt(record["loss"]),
        f"{record['bytes_up'] / 1024:.1f} KiB",
        f"{record['bytes_down'] / 1024:.1f} KiB",
        f"{record['seconds']:.1f}" if record["seconds"] is not None else "-",
        _fmt(record.get("asr"), pct=True),
        _fmt(record.get("local_asr"), pct=True),
        f"{eps:g}" if eps is not None else "-",
        _params_text(record),
    )
    return table


def _params_text(record: dict[str, Any]) -> str:
    """Parameters each client sent this round, and their share of the whole model."""
    sent, ratio = record.get("params_communicated"), record.get("comm_ratio")
    if not sent:
        return "-"
    return f"{sent:,}" + (f" ({100 * ratio:.4f} %)" if ratio is not None else "")


def _model_facts(
    model: str, seed: int, spec_kwargs: dict[str, Any], method: dict[str, Any]
) -> tuple[int, str, bytes | None, dict[str, Any]]:
    """(hidden size, fingerprint, vocabulary-initialised prompt, spec fields of the model) from the local model."""
    from transformers.utils import logging as hf_logging

    from worker.engine import PromptEngine

    hf_logging.disable_progress_bar()
    engine = PromptEngine.load(
        model,
        template=spec_kwargs["template"],
        verbalizer=spec_kwargs["verbalizer"],
        num_virtual_tokens=spec_kwargs["num_virtual_tokens"],
        max_length=spec_kwargs["max_length"],
        init="vocab",
        seed=seed,
        device="cpu",
        **method,
    )
    blob = engine.save_prompt({"version": "0", "method": engine.method})
    facts = {
        **method,
        "family": engine.family,
        "num_layers": engine.method_config.num_layers,
        "num_attention_heads": engine.num_attention_heads,
        "model_info": engine.description,
        "params_full_model": engine.model_parameters(),
    }
    return engine.hidden_size, engine.fingerprint, blob, facts


def run_baseline(
    out: Path,
    dataset: Path,
    spec: FederationSpec,
    steps: int,
    train_limit: int | None,
    eval_limit: int | None,
) -> dict[str, Any]:
    """Centralised prompt tuning with the same engine and the same number of training samples."""
    path = out / "baseline.json"
    args = [
        _bin("fedprompt-worker"),
        "train-local",
        "--dataset",
        str(dataset),
        "--model",
        spec.model,
        "--steps",
        str(steps),
        "--batch-size",
        str(spec.batch_size),
        "--lr",
        str(spec.lr),
        "--num-virtual-tokens",
        str(spec.num_virtual_tokens),
        "--max-length",
        str(spec.max_length),
        "--seed",
        str(spec.seed),
        "--template",
        spec.template,
        "--verbalizer",
        json.dumps(spec.verbalizer),
        "--eval-every",
        "0",
        "--out",
        str(path),
    ]
    if train_limit:
        args += ["--train-limit", str(train_limit)]
    if eval_limit:
        args += ["--eval-limit", str(eval_limit)]
    console.print(f"[bold]baseline:[/] centralised prompt tuning, {steps} steps of batch {spec.batch_size}")
    started = time.monotonic()
    subprocess.run(args, check=True, preexec_fn=_die_with_parent)
    data = json.loads(path.read_text())
    return {
        "steps": steps,
        "accuracy": data.get("final_accuracy"),
        "seconds": time.monotonic() - started,
        "file": str(path),
    }


def simulate_command(
    dataset: Annotated[
        str, typer.Option(help="Data set name (shared/datasets or $FEDPROMPT_DATASETS) or folder.")
    ] = "sst2",
    model: Annotated[str, typer.Option(help="Frozen PLM: hub id or local path.")] = DEFAULT_MODEL,
    clients: Annotated[int, typer.Option("--clients", "-k", min=1, help="K: worker processes.")] = 4,
    fraction: Annotated[
        float, typer.Option("--fraction", "-c", help="C: fraction selected per round.")
    ] = 0.5,
    rounds: Annotated[int, typer.Option("--rounds", "-t", min=1, help="T: federated rounds.")] = 3,
    local_steps: Annotated[int, typer.Option(min=1, help="Local optimisation steps per round.")] = 50,
    batch_size: Annotated[int, typer.Option(min=1)] = 16,
    lr: Annotated[float, typer.Option(help="Prompt learning rate (the paper: 0.3).")] = 0.3,
    num_virtual_tokens: Annotated[int, typer.Option(min=1, help="Soft prompt length (the paper: 20).")] = 20,
    max_length: Annotated[int, typer.Option(min=8, help="Real tokens per input.")] = 64,
    partition: Annotated[str, typer.Option(help="iid | quantity:ALPHA | label:ALPHA")] = "iid",
    seed: Annotated[int, typer.Option()] = 0,
    train_limit: Annotated[int | None, typer.Option(help="Use a seeded subset of the train split.")] = None,
    eval_limit: Annotated[int | None, typer.Option(help="Use a seeded subset of the test split.")] = None,
    template: Annotated[str | None, typer.Option(help="Override the data set's template.")] = None,
    verbalizer: Annotated[
        str | None, typer.Option(help='Override label words, JSON e.g. [["bad"],["good"]].')
    ] = None,
    database_url: Annotated[str | None, typer.Option(help="Default: a SQLite file in --out.")] = None,
    out: Annotated[
        Path, typer.Option(help="Results folder; reuse it to continue an interrupted run.")
    ] = Path("runs/simulate"),
    parallel: Annotated[
        int | None, typer.Option(min=1, help="Workers training at once (default: CPU cores).")
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
        int, typer.Option(min=0, help="Backdoor target label; every client reports the ASR towards it.")
    ] = 0,
    trigger: Annotated[str, typer.Option(help="Comma-separated trigger words.")] = "cf,mn,bb,tq",
    trigger_position: Annotated[str, typer.Option(help="random | start | end")] = "random",
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
) -> None:
    """Run a whole federation on this machine and write results.json, rounds.csv and accuracy.png."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    started = time.monotonic()
    out = out.resolve()
    try:
        folder, name, task = resolve_dataset_arg(dataset)
        _check_options(partition=partition, fraction=fraction, verbalizer=verbalizer)
        _check_attack_options(
            clients=clients,
            malicious=malicious,
            attack=attack,
            trigger=trigger,
            trigger_position=trigger_position,
            ldp_epsilon=ldp_epsilon,
            ldp_clip=ldp_clip,
            ldp_mechanism=ldp_mechanism,
            ldp_delta=ldp_delta,
            aggregation=aggregation,
        )
        if init_prompt is not None and not init_prompt.is_file():
            raise ValueError(f"--init-prompt {init_prompt} is not a file")
        if method not in METHODS or encoder_type not in ("mlp", "lstm"):
            raise ValueError(
                f"--method must be one of {', '.join(METHODS)} and --encoder-type mlp or lstm "
                f"(got {method!r}, {encoder_type!r})"
            )
    except Exception as exc:  # DataError, PartitionError, bad options: one readable line
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    (out / "logs").mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    parallel = parallel or cores
    threads = max(1, cores // min(parallel, clients))
    db = database_url or f"sqlite:///{out / 'fedprompt.db'}"
    admin_token = secrets.token_urlsafe(32)
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
        "FEDPROMPT_DATABASE_URL": db,
        "FEDPROMPT_ADMIN_TOKEN": admin_token,
        "FEDPROMPT_DATA_DIR": str(out),
        "FEDPROMPT_SWEEP_INTERVAL_S": "0.5",
    }
    state_path = out / "simulation.json"
    previous = json.loads(state_path.read_text()) if state_path.exists() else None

    procs = Processes()

    def on_term(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    old_term = signal.signal(signal.SIGTERM, on_term)
    try:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        procs.start(
            "coordinator",
            [_bin("fedprompt-coordinator"), "serve", "--port", str(port), "--log-level", "warning"],
            out / "logs" / "coordinator.log",
            env,
        )
        try:
            wait_ready(url, check=procs.check)
        except TimeoutError as exc:
            raise SimulationError(str(exc)) from None
        admin = CoordinatorClient(url, admin_token)
        if previous is not None:
            fid = int(previous["federation_id"])
            spec_json = admin.federation(fid)["spec"]
            console.print(
                f"continuing federation {fid} from {out} (round {admin.federation(fid)['current_round']})"
            )
        else:
            verb = json.loads(verbalizer) if verbalizer else None
            from worker.data import preset_for

            preset = preset_for(name, task)
            kwargs = {
                "template": template or preset.template,
                "verbalizer": verb or preset.verbalizer,
                "num_virtual_tokens": num_virtual_tokens,
                "max_length": max_length,
            }
            method_options = {
                "method": method,
                "encoder_type": encoder_type,
                "encoder_hidden_size": encoder_hidden_size,
                "prefix_projection": prefix_projection,
            }
            hidden, fingerprint, initial_blob, facts = _model_facts(model, seed, kwargs, method_options)
            spec = build_spec(
                dataset_name=name,
                task=task,
                model=model,
                clients=clients,
                fraction=fraction,
                rounds=rounds,
                local_steps=local_steps,
                batch_size=batch_size,
                lr=lr,
                num_virtual_tokens=num_virtual_tokens,
                max_length=max_length,
                seed=seed,
                round_deadline=round_deadline,
                template=kwargs["template"],
                verbalizer=kwargs["verbalizer"],
                hidden_size=hidden,
                fingerprint=fingerprint,
                aggregation=parse_aggregation(aggregation),
                privacy=privacy_spec(ldp_mechanism, ldp_epsilon, ldp_clip, ldp_delta),
                method=facts,
            )
            fid = admin.create_federation(spec.model_dump(mode="json"))["id"]
            if init_prompt is not None:
                initial_blob = init_prompt.read_bytes()
            if initial_blob is not None:
                admin.set_initial_prompt(fid, initial_blob)
            spec_json = admin.federation(fid)["spec"]
            state_path.write_text(
                json.dumps(
                    {
                        "federation_id": fid,
                        "dataset": str(folder),
                        "clients": clients,
                        "partition": partition,
                        "train_limit": train_limit,
                        "eval_limit": eval_limit,
                        "backdoor": {
                            "malicious": malicious,
                            "poison_rate": poison_rate,
                            "target_label": target_label,
                            "trigger": trigger,
                            "trigger_position": trigger_position,
                            "attack": attack,
                        },
                        "init_prompt": str(init_prompt) if init_prompt else None,
                    },
                    indent=2,
                )
            )
        setup = json.loads(state_path.read_text())
        clients = int(setup["clients"])
        token = admin.create_enrollment_token(fid, max_uses=clients)
        enrol_in_order(admin, url, fid, token, setup, int(spec_json["seed"]), out / "workers")
        for i in range(clients):
            args = [
                _bin("fedprompt-worker"),
                "serve",
                "--coordinator",
                url,
                "--federation",
                str(fid),
                "--enrollment-token",
                token,
                "--data",
                setup["dataset"],
                "--partition",
                setup["partition"],
                "--num-partitions",
                str(clients),
                "--partition-id",
                str(i),
                "--seed",
                str(spec_json["seed"]),
                "--state-dir",
                str(out / "workers" / str(i)),
                "--port",
                str(free_port()),
                "--name",
                f"client-{i}",
                "--threads",
                str(threads),
                "--slots-dir",
                str(out / "slots"),
                "--slots",
                str(parallel),
                "--poll-wait",
                "2",
                "--device",
                device,
                "--log-level",
                "warning",
            ]
            door = setup.get("backdoor") or {}
            if door:
                args += ["--target-label", str(door["target_label"]), "--trigger", door["trigger"]]
                args += ["--trigger-position", door["trigger_position"]]
                if i < int(door["malicious"]):
                    args += ["--poison-rate", str(door["poison_rate"]), "--attack", door["attack"]]
            if setup.get("train_limit"):
                args += ["--train-limit", str(setup["train_limit"])]
            if setup.get("eval_limit"):
                args += ["--eval-limit", str(setup["eval_limit"])]
            procs.start(f"worker {i}", args, out / "logs" / f"worker-{i}.log", env)
        records, initial = _follow(admin, fid, spec_json, clients, procs)
        if save_prompt is not None:
            save_prompt.parent.mkdir(parents=True, exist_ok=True)
            save_prompt.write_bytes(admin.prompt(fid, "latest").blob)
        extra: dict[str, Any] = {
            "federation_id": fid,
            "dataset": Path(setup["dataset"]).name,
            "clients": clients,
            "partition": setup["partition"],
            "train_limit": setup.get("train_limit"),
            "eval_limit": setup.get("eval_limit"),
            "backdoor": setup.get("backdoor"),
            "init_prompt": setup.get("init_prompt"),
            "parallel": parallel,
            "environment": {
                "python": platform.python_version(),
                "platform": platform.platform(),
                "cpu_count": cores,
                "device": device,
                "torch": _torch_version(),
            },
            **ledger_fields(spec_json),
            "scoring": "label words read through the tied input embeddings (the checkpoint has no MLM head)"
            if "MiniLM" in spec_json["model"]
            else "masked-LM head",
        }
        procs.stop()
        if baseline:
            total = sum(r["participants"] for r in records) * spec_json["local_steps"]
            extra["baseline"] = run_baseline(
                out,
                Path(setup["dataset"]),
                FederationSpec.model_validate(spec_json),
                total,
                setup.get("train_limit"),
                setup.get("eval_limit"),
            )
        results = write_results(out, spec_json, records, initial, time.monotonic() - started, extra)
    except KeyboardInterrupt:
        console.print(
            "[yellow]interrupted:[/] stopping every process; run the same command again to continue"
        )
        procs.stop()
        raise typer.Exit(130) from None
    except SimulationError as exc:
        procs.stop()
        console.print(f"[red]error:[/] {exc}; see the logs in {out / 'logs'}")
        raise typer.Exit(1) from None
    finally:
        procs.stop()
        signal.signal(signal.SIGTERM, old_term)
    acc = results["final_accuracy"]
    console.print(
        f"[bold green]done[/] in {results['wall_seconds']:.0f}s: final accuracy "
        f"{_fmt(acc, pct=True)} % (initial {_fmt(results['initial_accuracy'], pct=True)} %), "
        f"{results['total_bytes_up'] / 1024:.0f} KiB up, {results['total_bytes_down'] / 1024:.0f} KiB down"
    )
    if results.get("baseline"):
        console.print(f"centralised baseline: {_fmt(results['baseline']['accuracy'], pct=True)} %")
    if results.get("final_asr") is not None:
        console.print(
            f"attack success rate: {_fmt(results['final_asr'], pct=True)} % "
            f"(clean, initial prompt: {_fmt(results['initial_asr'], pct=True)} %)"
        )
    console.print(f"results: {out / 'results.json'}, {out / 'rounds.csv'}, {out / 'accuracy.png'}")


def enrol_in_order(
    admin: CoordinatorClient, url: str, fid: int, token: str, setup: dict[str, Any], seed: int, workers: Path
) -> None:
    """Enrol client-0 … client-(K-1) in that order, each into its worker's state folder, before any
    worker starts: client ids, and so the seeded selection of a round, follow the worker index instead
    of which process happened to enrol first. A worker that finds its credentials does not enrol."""
    from worker.shards import ShardSpec, shard_sizes
    from worker.state import Credentials, StateDir

    clients = int(setup["clients"])
    missing = [i for i in range(clients) if StateDir(workers / str(i)).load_credentials(fid) is None]
    if not missing:
        return
    try:
        sizes = shard_sizes(
            ShardSpec(
                data=setup["dataset"],
                partition=setup["partition"],
                num_partitions=clients,
                seed=seed,
                train_limit=setup.get("train_limit"),
                eval_limit=setup.get("eval_limit"),
            )
        )
    except ValueError as exc:  # DataError, PartitionError
        raise SimulationError(f"cannot give each of the {clients} clients its data: {exc}") from None
    for i in missing:
        try:
            enrolled = admin.enroll(
                fid, token, name=f"client-{i}", num_samples=sizes[i][0], info={"num_eval": sizes[i][1]}
            )
        except ApiError as exc:
            raise SimulationError(f"enrolling client-{i} failed: {exc}") from None
        StateDir(workers / str(i)).save_credentials(
            Credentials(url, fid, enrolled["client_id"], enrolled["token"])
        )


def _torch_version() -> str:
    try:
        import torch

        return torch.__version__
    except ImportError:
        return "absent"


def _follow(
    admin: CoordinatorClient, fid: int, spec: dict[str, Any], clients: int, procs: Processes
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Show progress until every round is closed and evaluated; return the records."""
    total_rounds = int(spec["rounds"])
    printed: set[int] = set()
    header = True
    eval_grace = 300.0
    closed_seen: dict[int, float] = {}
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        bar = progress.add_task("waiting for clients", total=clients)
        while True:
            procs.check()
            status = admin.federation(fid)
            history = admin.rounds(fid)
            open_round = status.get("open_round")
            if open_round:
                parts = open_round["participants"]
                progress.update(
                    bar,
                    description=f"round {open_round['round']}/{total_rounds}: uploads",
                    completed=sum(p["uploaded"] for p in parts),
                    total=len(parts),
                )
            elif status["state"] == "waiting":
                progress.update(bar, completed=status["clients"]["enrolled"], total=clients)
            active = status["clients"]["active"]
            for record in round_records(history, spec):
                r = record["round"]
                closed_seen.setdefault(r, time.monotonic())
                complete = record["eval_clients"] >= active
                if r not in printed and (complete or time.monotonic() - closed_seen[r] > eval_grace):
                    progress.console.print(_row_table(record, header))
                    header = False
                    printed.add(r)
            if status["state"] == "completed" and len(printed) >= total_rounds:
                break
            time.sleep(0.5)
    initial = admin.evaluation(fid, 0)
    return round_records(admin.rounds(fid), spec), initial
