"""`fedprompt simulate`'s options: parsed and checked before any process starts, then the federation spec.

A bad option is a ValueError (or the worker's DataError / PartitionError / AttackError, all
ValueErrors) whose message names the option; the command prints it as one line.
"""

from __future__ import annotations

import math
import multiprocessing
import random
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedprompt.shared.spec import (
    ASYNC_BUFFER_SIZE,
    ASYNC_MAX_STALENESS,
    FederationSpec,
    check_precision,
    default_lr,
)
from fedprompt.shared.spec_options import SECURE_AGGREGATION_MIN_CLIENTS, check_secure_aggregation
from fedprompt.shared.vocab import (
    AggregationRule,
    DriftCorrection,
    EncoderType,
    LocalOptimizer,
    Method,
    Mode,
    Scoring,
    ServerOptimizer,
    choices,
)
from fedprompt.sim.data_options import Dataset, resolve_data

__all__ = ["Dataset", "SimulateOptions", "federation_spec", "validate"]

# --evaluators unless given, above this many clients: the test split is dealt to the first ten to
# enrol, so the evaluation tasks per version stop growing with K (BENCHMARKS.md §9: K = 100 within
# 1.10× of K = 20 at ten clients per round in 3 of 3 repeats this way, 1 of 3 with every client).
# At or below ten clients every client evaluates its share, as before.
DEFAULT_EVALUATORS = 10
SYNC_FRACTION = 0.5  # --fraction unless given, with rounds (mode async selects no one: every client trains)
# The options of mode async, each the spec's field of the same name.
ASYNC_OPTIONS = ("concurrency", "buffer_size", "max_staleness", "server_lr")

# the spec's default (shared/spec_options.py: label_skew_default) as --drift-correction says it
DEFAULT_DRIFT_CORRECTION = "balanced:entropy_scaling=true"
# A run (simulation.json) or grid record made before an option was recorded, or before its default
# changed, and without the option, ran with this value: drift correction was none until this build.
IMPLIED_OPTIONS = {"drift_correction": "none"}


@dataclass(frozen=True, kw_only=True)
class SimulateOptions:
    """Every option of `fedprompt simulate` (the command's parameters, one field each)."""

    dataset: str
    model: str
    clients: int
    fraction: float | None  # None: the mode's, filled in at once (round_fraction)
    rounds: int
    local_steps: int
    local_epochs: float | None
    batch_size: int
    lr: float | None
    num_virtual_tokens: int
    max_length: int
    partition: str
    seed: int
    train_limit: int | None
    eval_limit: int | None
    evaluators: int | None
    template: str | None
    verbalizer: str | None
    test_data: str | None
    text_column: str
    text_b_column: str | None
    label_column: str
    labels: str | None
    database_url: str | None
    out: Path
    parallel: int | None
    processes: int | None
    round_deadline: float
    baseline: bool
    device: str
    malicious: int
    poison_rate: float
    target_label: int
    measure_asr: bool
    trigger: str
    trigger_position: str
    attack: str
    ldp_epsilon: float | None
    ldp_clip: float | None
    ldp_mechanism: str
    ldp_delta: float | None
    aggregation: str
    server_optimizer: str
    init: str
    init_prompt: Path | None
    save_prompt: Path | None
    method: str
    encoder_type: str
    encoder_hidden_size: int | None
    prefix_projection: bool
    scoring: str
    secure_aggregation: bool = False
    secagg_clip: float | None = None
    precision: str = "auto"
    drift_correction: str = DEFAULT_DRIFT_CORRECTION
    local_optimizer: str = LocalOptimizer.ADAMW
    mode: str = Mode.SYNC
    concurrency: int | None = None
    buffer_size: int | None = None
    max_staleness: int | None = None
    server_lr: float | None = None
    client_speed: str | None = None
    track: str | None = None
    dashboard_port: int | None = None
    resume: bool = False
    force: bool = False
    data_name: str | None = None

    def __post_init__(self) -> None:
        # --fraction as the mode implies when not given: simulation.json records the fraction a run
        # used, as a run from before --mode recorded its 0.5
        object.__setattr__(self, "fraction", self.round_fraction)
        # --evaluators likewise: simulation.json records the evaluators a run used
        if self.evaluators is None and self.clients > DEFAULT_EVALUATORS:
            object.__setattr__(self, "evaluators", DEFAULT_EVALUATORS)

    @property
    def round_fraction(self) -> float:
        """C as the spec gets it: --fraction, else 0.5 with rounds and 1 in mode async (which selects
        no one: every client trains as soon as it asks)."""
        if self.fraction is not None:
            return self.fraction
        return 1.0 if self.mode == Mode.ASYNC else SYNC_FRACTION


def parse_aggregation(
    text: str, option: str = "--aggregation", example: str = "trimmed_mean:beta=0.2"
) -> dict[str, Any]:
    """'trimmed_mean:beta=0.2' or 'multi_krum:f=1,m=7' → {"name": ..., "params": {...}} (numbers parsed);
    `option` and `example` name the command-line option in the messages."""
    name, _, rest = text.strip().partition(":")
    params: dict[str, Any] = {}
    for item in filter(None, (x.strip() for x in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"{option} {text!r}: parameters are key=value, e.g. {example}")
        try:
            number = float(value)
        except ValueError:
            params[key.strip()] = value.strip()
            continue
        params[key.strip()] = int(number) if number.is_integer() and "." not in value else number
    if not name:
        raise ValueError(f"{option} needs a name, e.g. {example}")
    return {"name": name, "params": params}


def parse_server_optimizer(text: str) -> dict[str, Any] | None:
    """'fedadam:lr=0.1,beta1=0.9' → {"name": "fedadam", "lr": 0.1, "beta1": 0.9}; 'fedavg' → None (plain
    FedAvg), validated by the spec's ServerOptimizerSpec."""
    from fedprompt.shared.spec_options import ServerOptimizerSpec
    from pydantic import ValidationError

    parsed = parse_aggregation(text, "--server-optimizer", "fedadam:lr=0.1")
    if parsed["name"] == ServerOptimizer.FEDAVG and not parsed["params"]:
        return None
    fields = {"name": parsed["name"], **parsed["params"]}
    try:
        return ServerOptimizerSpec.model_validate(fields).model_dump(exclude_none=True)
    except ValidationError as exc:
        problems = "; ".join(e["msg"] for e in exc.errors())
        raise ValueError(f"--server-optimizer {text!r}: {problems}") from None


def parse_drift_correction(text: str) -> dict[str, Any] | None:
    """'fedprox:mu=0.1' → {"name": "fedprox", "mu": 0.1}; 'scaffold'; 'balanced' (the logit-adjusted
    loss alone; 'fedprox:balanced_loss=true' with FedProx); 'none' → None, validated by the spec's
    DriftCorrectionSpec."""
    from fedprompt.shared.spec_options import DriftCorrectionSpec
    from pydantic import ValidationError

    parsed = parse_aggregation(text, "--drift-correction", "fedprox:mu=0.01")
    if parsed["name"] == DriftCorrection.NONE and not parsed["params"]:
        return None
    if parsed["name"] == "balanced":  # the balanced loss alone: 'balanced' or 'balanced:tau=0.5'
        parsed = {"name": DriftCorrection.NONE, "params": {"balanced_loss": True, **parsed["params"]}}
    try:
        checked = DriftCorrectionSpec.model_validate({"name": parsed["name"], **parsed["params"]})
        return checked.model_dump(exclude_none=True, exclude_defaults=True) | {"name": checked.name}
    except ValidationError as exc:
        problems = "; ".join(e["msg"] for e in exc.errors())
        raise ValueError(f"--drift-correction {text!r}: {problems}") from None


def privacy_spec(
    mechanism: str, epsilon: float | None, clip: float | None, delta: float | None
) -> dict[str, Any] | None:
    """The federation's privacy block from the --ldp-* options (None: LDP off), validated by PrivacySpec."""
    from fedprompt.shared.spec_options import PrivacySpec
    from pydantic import ValidationError

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


def check_attack_options(opts: SimulateOptions) -> None:
    """Refuse bad backdoor, privacy and aggregation options."""
    from fedprompt.coordinator.logic.aggregation import check_params
    from fedprompt.worker.poison import parse_attack, parse_trigger

    if not 0 <= opts.malicious <= opts.clients:
        raise ValueError(
            f"--malicious must be between 0 and --clients ({opts.clients}); got {opts.malicious}"
        )
    parse_attack(opts.attack)
    parse_trigger(opts.trigger, opts.trigger_position)
    privacy_spec(opts.ldp_mechanism, opts.ldp_epsilon, opts.ldp_clip, opts.ldp_delta)
    agg = parse_aggregation(opts.aggregation)
    check_params(agg["name"], agg["params"])
    parse_server_optimizer(opts.server_optimizer)
    drift = parse_drift_correction(opts.drift_correction)
    if drift is not None and drift["name"] == DriftCorrection.SCAFFOLD:
        clash = [
            what
            for what, on in (
                ("--secure-aggregation", opts.secure_aggregation),
                ("--ldp-epsilon", opts.ldp_epsilon is not None),
                (f"--aggregation {agg['name']}", agg["name"] != AggregationRule.FEDAVG),
            )
            if on
        ]
        if clash:
            raise ValueError(f"--drift-correction scaffold cannot be combined with {clash[0]}; use fedprox")
    if opts.secure_aggregation:  # the spec's rule, in the options' names
        check_secure_aggregation(
            agg["name"],
            opts.clients,
            option="--secure-aggregation",
            rule_option="--aggregation {}",
            clients_option="--clients",
        )
    if opts.secagg_clip is not None and not opts.secagg_clip > 0:
        raise ValueError(f"--secagg-clip must be positive; got {opts.secagg_clip}")
    if opts.init not in ("vocab", "label"):
        raise ValueError(f"--init must be vocab or label; got {opts.init!r}")
    if opts.processes is not None and opts.processes > opts.clients:
        raise ValueError(f"--processes ({opts.processes}) cannot exceed --clients ({opts.clients})")


def check_data_options(opts: SimulateOptions) -> None:
    """Refuse a bad partition or fraction (the verbalizer is checked with the data: sim/data_options.py)."""
    from fedprompt.worker.data import parse_partition

    parse_partition(opts.partition)
    if not 0 < opts.round_fraction <= 1:
        raise ValueError(f"--fraction must be in (0, 1]; got {opts.round_fraction}")
    if opts.evaluators is not None and not 1 <= opts.evaluators <= opts.clients:
        raise ValueError(f"--evaluators must be in 1..{opts.clients} (--clients); got {opts.evaluators}")


def check_method_options(opts: SimulateOptions) -> None:
    """Refuse an unknown prompt method or encoder, or a starting prompt that is not a file."""
    if opts.init_prompt is not None and not opts.init_prompt.is_file():
        raise ValueError(f"--init-prompt {opts.init_prompt} is not a file")
    scorings, encoders = [s.value for s in Scoring], [e.value for e in EncoderType]
    if opts.scoring not in scorings:
        raise ValueError(f"--scoring must be {choices(scorings, quote=False)}; got {opts.scoring!r}")
    check_precision(opts.precision)
    if opts.method not in [m.value for m in Method] or opts.encoder_type not in encoders:
        raise ValueError(
            f"--method must be one of {', '.join(Method)} and --encoder-type "
            f"{choices(encoders, quote=False)} (got {opts.method!r}, {opts.encoder_type!r})"
        )


def check_schedule_options(opts: SimulateOptions) -> None:
    """Refuse the async options without --mode async, what mode async cannot do (the spec's rules in
    the options' names), and a bad --client-speed."""
    modes = [m.value for m in Mode]
    if opts.mode not in modes:
        raise ValueError(f"--mode must be {choices(modes, quote=False)}; got {opts.mode!r}")
    given = [name for name in ASYNC_OPTIONS if getattr(opts, name) is not None]
    if opts.mode != Mode.ASYNC and given:
        named = ", ".join("--" + name.replace("_", "-") for name in given)
        raise ValueError(f"{named}: only with --mode async (this run is --mode {opts.mode})")
    if opts.mode == Mode.ASYNC:
        refused = "--mode async cannot be combined with"
        if opts.round_fraction != 1.0:
            raise ValueError(
                f"{refused} --fraction {opts.round_fraction:g}: there is no per-round selection, every "
                "client trains as soon as it asks; leave out --fraction, or limit the clients training "
                "at once with --concurrency"
            )
        if opts.secure_aggregation:
            raise ValueError(
                f"{refused} --secure-aggregation: its masks cancel only in the sum of one fixed set of "
                "clients that started from the same version, and a buffer holds whoever arrives, from "
                "any version"
            )
        if parse_aggregation(opts.drift_correction)["name"] == DriftCorrection.SCAFFOLD:
            raise ValueError(
                f"{refused} --drift-correction scaffold: its control variates assume every update starts "
                "from the round's version; use fedprox"
            )
        if opts.server_lr is not None and not 0 < opts.server_lr <= 100:
            raise ValueError(f"--server-lr must be in (0, 100]; got {opts.server_lr:g}")
    client_slowdowns(opts)


def parse_client_speed(text: str, clients: int, seed: int) -> list[float]:
    """Each of `clients` clients' slowdown factor (≥ 1: a client f times slower than it is) from
    --client-speed: 'F1,F2,…' (cycled over the clients in order), 'linear:max=M' (client i of K:
    1 + (M − 1)·i/(K − 1), from full speed to M) or 'lognormal:sigma=S,max=M' (exp(|N(0, S²)|) clipped
    to M, drawn from `seed`: most clients near full speed, a long tail of slow ones)."""
    kinds = {"linear": ("max",), "lognormal": ("sigma", "max")}
    name = text.partition(":")[0].strip()
    if name not in kinds:
        if ":" in text or "=" in text or not text.strip():
            raise ValueError(
                f"--client-speed {text!r}: give linear:max=M, lognormal:sigma=S,max=M or a list of "
                "factors, e.g. 1,1,2,4"
            )
        factors = [_factor(text, item) for item in text.split(",")]
        return [factors[i % len(factors)] for i in range(clients)]
    params = parse_aggregation(text, "--client-speed", "linear:max=4")["params"]
    if sorted(params) != sorted(kinds[name]):
        raise ValueError(
            f"--client-speed {text!r}: {name} takes {' and '.join(kinds[name])}, e.g. "
            + ("linear:max=4" if name == "linear" else "lognormal:sigma=1,max=10")
        )
    top = _factor(text, str(params["max"]), "max")
    if name == "linear":
        return [1.0 + (top - 1.0) * i / (clients - 1) if clients > 1 else 1.0 for i in range(clients)]
    sigma = params["sigma"]
    if isinstance(sigma, str) or not 0 <= sigma < math.inf:
        raise ValueError(f"--client-speed {text!r}: sigma must be a number ≥ 0; got {sigma}")
    # a draw of its own: the same seed's data partition and selection do not move the speeds, nor back
    rng = random.Random(f"client-speed:{seed}")
    return [min(top, math.exp(abs(rng.gauss(0.0, sigma)))) for _ in range(clients)]


def _factor(text: str, item: str, what: str = "a slowdown factor") -> float:
    """One factor of --client-speed `text`: a number ≥ 1 (1: full speed, 3: three times slower)."""
    try:
        value = float(item)
    except ValueError:
        raise ValueError(f"--client-speed {text!r}: {item.strip()!r} is not a number") from None
    if not 1 <= value < math.inf:
        raise ValueError(
            f"--client-speed {text!r}: {what} must be ≥ 1 (1: full speed, 3: three times slower); "
            f"got {item.strip()}"
        )
    return value


def client_slowdowns(opts: SimulateOptions) -> list[float] | None:
    """Each client's slowdown factor from --client-speed (None without it: every client at full speed)."""
    if opts.client_speed is None:
        return None
    return parse_client_speed(opts.client_speed, opts.clients, opts.seed)


def mode_fields(opts: SimulateOptions) -> dict[str, Any]:
    """The spec's mode and the async fields the options give (the spec fills in the others' defaults);
    nothing with rounds, the spec's default."""
    if opts.mode != Mode.ASYNC:
        return {}
    given = {name: getattr(opts, name) for name in ASYNC_OPTIONS if getattr(opts, name) is not None}
    return {"mode": Mode.ASYNC, **given}


def async_line(opts: SimulateOptions) -> str:
    """Mode async's settings with the spec's defaults filled in, for simulate's header."""
    buffer = opts.buffer_size if opts.buffer_size is not None else ASYNC_BUFFER_SIZE
    staleness = opts.max_staleness if opts.max_staleness is not None else ASYNC_MAX_STALENESS
    at_once = f"at most {opts.concurrency}" if opts.concurrency is not None else "every client"
    return (
        f"mode async: {at_once} training at once, a version every {buffer} update(s), updates at most "
        f"{staleness} version(s) stale, server lr {opts.server_lr if opts.server_lr is not None else 1.0:g}"
    )


def validate(opts: SimulateOptions) -> Dataset:
    """Every check above, in the order a user meets them; the data set the options name."""
    check_data_options(opts)
    check_schedule_options(opts)
    dataset = resolve_data(opts, opts.out.resolve())
    check_attack_options(opts)
    check_method_options(opts)
    check_track(opts.track)
    return dataset


def check_track(text: str | None) -> None:
    """A --track value that can be used, with its tracker installed (checked before the run, not
    after it)."""
    import importlib.util

    from fedprompt.sim.tracking import parse_track

    track = parse_track(text)
    if track is not None and importlib.util.find_spec(track[0]) is None:
        raise ValueError(f"--track {text}: {track[0]} is not installed; pip install 'fedprompt[tracking]'")


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
    local_epochs: float | None = None,
    num_virtual_tokens: int,
    max_length: int,
    seed: int,
    round_deadline: float,
    template: str,
    verbalizer: list[list[str]],
    hidden_size: int,
    fingerprint: str | None,
    aggregation: dict[str, Any] | None = None,
    privacy: dict[str, Any] | None = None,
    method: dict[str, Any] | None = None,
    server_optimizer: dict[str, Any] | None = None,
    secure_aggregation: dict[str, Any] | None = None,
    precision: str = "auto",
    drift_correction: dict[str, Any] | None = None,
    evaluators: int | None = None,
    local_optimizer: str = LocalOptimizer.ADAMW,
    mode: dict[str, Any] | None = None,
) -> FederationSpec:
    """The federation spec for a simulation (`method`: method, encoder and model-shape fields; `mode`:
    mode async and its fields, mode_fields); the template and label words are the data's
    (sim/data_options.py chose them)."""
    return FederationSpec(
        name=f"simulate-{dataset_name}",
        model=model,
        model_fingerprint=fingerprint,
        num_virtual_tokens=num_virtual_tokens,
        hidden_size=hidden_size,
        template=template,
        verbalizer=verbalizer,
        max_length=max_length,
        rounds=rounds,
        fraction=fraction,
        # secure aggregation needs three clients in every round (two could each learn the other's update)
        min_clients=SECURE_AGGREGATION_MIN_CLIENTS if secure_aggregation is not None else 1,
        expected_clients=clients,
        quorum=1,
        round_deadline_s=round_deadline,
        availability_timeout_s=max(3600.0, round_deadline),
        local_steps=local_steps,
        local_epochs=local_epochs,
        batch_size=batch_size,
        lr=lr,
        seed=seed,
        aggregation=aggregation or {"name": AggregationRule.FEDAVG, "params": {}},
        privacy=privacy,
        server_optimizer=server_optimizer,
        secure_aggregation=secure_aggregation,
        precision=precision,
        drift_correction=drift_correction,
        evaluators=evaluators,
        local_optimizer=local_optimizer,
        **(method or {}),
        **(mode or {}),
    )


def model_facts(
    model: str, seed: int, spec_kwargs: dict[str, Any], method: dict[str, Any], init: str = "vocab"
) -> tuple[int, str, bytes | None, dict[str, Any]]:
    """(hidden size, fingerprint, initial prompt (vocabulary or label words), spec fields of the model)
    from the local model."""
    from fedprompt.worker.engine import PromptEngine
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    engine = PromptEngine.load(
        model,
        template=spec_kwargs["template"],
        verbalizer=spec_kwargs["verbalizer"],
        num_virtual_tokens=spec_kwargs["num_virtual_tokens"],
        max_length=spec_kwargs["max_length"],
        init=init,
        seed=seed,
        device="cpu",
        **method,
    )
    blob = engine.save_prompt({"version": "0", "method": engine.method})
    facts = {
        **method,
        # the scoring the engine resolved, so the spec says exactly how labels were read
        "scoring": Scoring.MEAN_POOL
        if engine.scoring == Scoring.MEAN_POOL
        else (Scoring.TIED_EMBEDDINGS if engine.head == Scoring.TIED_EMBEDDINGS else Scoring.AUTO),
        "family": engine.family,
        "num_layers": engine.method_config.num_layers,
        "kv_size": engine.method_config.kv_size,
        "num_attention_heads": engine.num_attention_heads,
        "model_info": engine.description,
        "params_full_model": engine.model_parameters(),
    }
    return engine.hidden_size, engine.fingerprint, blob, facts


def secure_aggregation_spec(opts: SimulateOptions, lr: float) -> dict[str, Any] | None:
    """The spec's secure_aggregation block (None: off). Its clipping range defaults to lr × local_steps:
    AdamW moves an element by about lr per step at most, so a round's update stays within it."""
    if not opts.secure_aggregation:
        return None
    clip = opts.secagg_clip if opts.secagg_clip is not None else lr * opts.local_steps
    return {"clip": min(clip, 1e6)}


def federation_spec(opts: SimulateOptions, dataset: Dataset) -> tuple[FederationSpec, bytes | None]:
    """The spec of a new federation from the options and the local model, and its starting prompt
    (--init-prompt, else the model's vocabulary initialisation)."""
    kwargs: dict[str, Any] = {
        "template": dataset.template,
        "verbalizer": [list(words) for words in dataset.verbalizer or ()],
        "num_virtual_tokens": opts.num_virtual_tokens,
        "max_length": opts.max_length,
    }
    method_options = {
        "method": opts.method,
        "encoder_type": opts.encoder_type,
        "encoder_hidden_size": opts.encoder_hidden_size,
        "prefix_projection": opts.prefix_projection,
        "scoring": opts.scoring,
    }
    # in a short-lived child process, so that the model's memory leaves with it: this process then only
    # follows the federation (BENCHMARKS.md §7). Forked where the platform allows (no second import
    # of torch); this process has run no torch operation yet.
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as child:
        hidden, fingerprint, initial_blob, facts = child.submit(
            model_facts, opts.model, opts.seed, kwargs, method_options, opts.init
        ).result()
    lr = opts.lr if opts.lr is not None else default_lr(facts["scoring"], opts.model, opts.local_optimizer)
    spec = build_spec(
        dataset_name=dataset.name,
        task=dataset.task,
        model=opts.model,
        clients=opts.clients,
        fraction=opts.round_fraction,
        rounds=opts.rounds,
        local_steps=opts.local_steps,
        local_epochs=opts.local_epochs,
        batch_size=opts.batch_size,
        lr=lr,
        num_virtual_tokens=opts.num_virtual_tokens,
        max_length=opts.max_length,
        seed=opts.seed,
        round_deadline=opts.round_deadline,
        template=kwargs["template"],
        verbalizer=kwargs["verbalizer"],
        hidden_size=hidden,
        fingerprint=fingerprint,
        aggregation=parse_aggregation(opts.aggregation),
        privacy=privacy_spec(opts.ldp_mechanism, opts.ldp_epsilon, opts.ldp_clip, opts.ldp_delta),
        method=facts,
        server_optimizer=parse_server_optimizer(opts.server_optimizer),
        secure_aggregation=secure_aggregation_spec(opts, lr),
        precision=opts.precision,
        drift_correction=parse_drift_correction(opts.drift_correction),
        evaluators=opts.evaluators,
        local_optimizer=opts.local_optimizer,
        mode=mode_fields(opts),
    )
    if opts.init_prompt is not None:
        initial_blob = opts.init_prompt.read_bytes()
    return spec, initial_blob
