"""FederationSpec: everything that defines a federation, validated on construction."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, get_args

import numpy as np
from fedprompt.shared import drift
from fedprompt.shared.methods import PROMPT_TENSOR, MethodConfig, MethodError, num_parameters
from fedprompt.shared.methods import tensor_shapes as method_tensor_shapes
from fedprompt.shared.spec_options import (
    AggregationSpec,
    DriftCorrectionSpec,
    PrivacySpec,
    SecureAggregationSpec,
    ServerOptimizerSpec,
    check_secure_aggregation,
    label_skew_default,
)
from fedprompt.shared.vocab import (
    SERVER_OPTIMIZER_DEFAULTS,
    AggregationRule,
    ByText,
    EncoderType,
    Family,
    LocalOptimizer,
    Method,
    Mode,
    Scoring,
)
from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"

Precision = Literal["auto", "fp32", "bf16"]
PRECISIONS: tuple[str, ...] = get_args(Precision)


def check_precision(value: str) -> None:
    """ValueError naming the choices for a precision that is none of them."""
    if value not in PRECISIONS:
        raise ValueError(f"precision must be {', '.join(PRECISIONS[:-1])} or {PRECISIONS[-1]}; got {value!r}")


PRECISION_HELP = (
    "Arithmetic of the frozen model: fp32 | bf16 (bfloat16 autocast; the prompt and its optimiser stay "
    "float32; on a CPU it needs AVX512-BF16 or AMX to be fast, `python -m bench.levers`) | auto (bf16 on "
    "CUDA, fp32 on a CPU)."
)
PAPER_LR = 0.3  # the paper's prompt learning rate, for label scores read through a (M)LM head
MEAN_POOL_LR = 0.01  # the rate mean-pool similarity scoring learns at (bench/scoring.py)
SGD_LR = 1.0  # plain SGD's rate for the prompt (clipped gradients of norm <= 1; docs/label-skew.md)


def client_steps(local_steps: int, local_epochs: float | None, num_samples: int, batch_size: int) -> int:
    """A client's local steps in a round: local_steps, capped at local_epochs passes over its own data."""
    if local_epochs is None:
        return local_steps
    return max(1, min(local_steps, math.ceil(local_epochs * num_samples / batch_size)))


# Checkpoints without an MLM head: scoring "auto" reads their labels by mean-pool similarity.
HEADLESS_ENCODERS = ("all-MiniLM-L6-v2",)


def default_lr(scoring: str, model: str | None = None, optimizer: str = LocalOptimizer.ADAMW) -> float:
    """The prompt's learning rate when none is given, the one rule of every path that makes a spec (REST,
    `fedprompt federation create`, simulate): with AdamW, mean-pool scoring (asked for, or "auto" on a
    checkpoint without an MLM head such as the default MiniLM) learns at 0.01, label words through a
    head at 0.3; plain SGD at 1.0."""
    if optimizer == LocalOptimizer.SGD:
        return SGD_LR
    headless = model is not None and model.rstrip("/").rsplit("/", 1)[-1] in HEADLESS_ENCODERS
    return (
        MEAN_POOL_LR if scoring == Scoring.MEAN_POOL or (scoring == Scoring.AUTO and headless) else PAPER_LR
    )


# A name (of a federation, of a client): no control characters (NUL, newlines, escapes: Unicode's Cc),
# which a database column may refuse (Postgres: NUL) and a log line or the dashboard should not show.
NAME_PATTERN = r"^[^\x00-\x1f\x7f-\x9f]+$"
__all__ = [
    "DEFAULT_MODEL",
    "PROMPT_TENSOR",
    "SERVER_OPTIMIZER_DEFAULTS",
    "FederationSpec",
    "initial_prompt",
]

# The spec's fields of the vocabulary's names (shared/vocab.py), taken from their text.
FamilyName = Annotated[Family, ByText()]
MethodName = Annotated[Method, ByText()]
EncoderTypeName = Annotated[EncoderType, ByText()]
ScoringName = Annotated[Scoring, ByText()]
LocalOptimizerName = Annotated[LocalOptimizer, ByText()]
ModeName = Annotated[Mode, ByText()]


class FederationSpec(BaseModel):
    """A federation: model, prompt, task template, round schedule and local training config."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=(), allow_inf_nan=False)

    name: str = Field("federation", min_length=1, max_length=200, pattern=NAME_PATTERN)
    model: str = Field(DEFAULT_MODEL, min_length=1, description="Hub id or local path of the frozen PLM.")
    model_fingerprint: str | None = Field(None, description="Workers with another model refuse to join.")
    model_info: dict[str, Any] | None = Field(
        None,
        description="What the fingerprint hashes (architecture, hidden size, layers, vocabulary size, file "
        "hashes); a worker whose model differs names the differing fields.",
    )
    family: FamilyName = Field(
        Family.MASKED_LM,
        description="How label words are read: at [MASK] (masked LM), as the next token after the text "
        "before [MASK] (causal LM), or as the first decoder token (seq2seq).",
    )
    method: MethodName = Method.PROMPT_TUNING
    num_virtual_tokens: int = Field(20, ge=1, le=1024)
    hidden_size: int = Field(384, ge=1, le=65536, description="Hidden size of the PLM (MiniLM: 384).")
    num_layers: int | None = Field(
        None, ge=1, le=1024, description="Transformer layers of the PLM (needed by prefix tuning)."
    )
    num_attention_heads: int | None = Field(
        None, ge=1, le=1024, description="Attention heads of the PLM (needed to export prefix tuning)."
    )
    kv_size: int | None = Field(
        None,
        ge=1,
        le=65536,
        description="Width of one layer's key/value states, for prefix tuning: num_key_value_heads × head_dim "
        "for a model with grouped-query attention (SmolLM2: 3 × 64); default hidden_size.",
    )
    encoder_type: EncoderTypeName = Field(EncoderType.MLP, description="P-tuning's prompt encoder.")
    encoder_hidden_size: int | None = Field(
        None, ge=1, le=65536, description="Hidden size of the prompt encoder (default: hidden_size)."
    )
    encoder_num_layers: int = Field(2, ge=1, le=8, description="LSTM layers of P-tuning's LSTM encoder.")
    prefix_projection: bool = Field(
        False, description="Prefix tuning re-parameterised by an MLP (then the MLP is communicated)."
    )
    scoring: ScoringName = Field(
        Scoring.AUTO,
        description="How label scores are read: auto = the label words through the model's LM / MLM head, "
        "or, for an encoder whose checkpoint has no MLM head (all-MiniLM-L6-v2), mean-pool similarity: "
        "20 × cosine of the mean-pooled output with each label phrase (the template's words with [MASK] "
        "replaced by the label word); tied-embeddings = the label words at [MASK] through the tied input "
        "embeddings; mean-pool = similarity scoring on any encoder.",
    )
    precision: Precision = Field(
        "auto",
        description="The workers' arithmetic: fp32; bf16 = bfloat16 autocast of the frozen model's forward "
        "and backward (the prompt and its optimiser stay float32; on a CPU it needs bfloat16 instructions, "
        "AVX512-BF16 or AMX, to be fast); auto = bf16 on CUDA, fp32 on a CPU.",
    )
    params_full_model: int | None = Field(
        None, ge=1, description="Parameters of the whole PLM: the ledger's full fine-tuning reference."
    )
    init_std: float = Field(
        0.05, gt=0, le=100, description="Std of the seeded random initial prompt (≈ word-embedding scale)."
    )
    template: str = Field("{text} It was [MASK].", min_length=1)
    verbalizer: list[list[str]] = Field(default_factory=lambda: [["terrible"], ["great"]], min_length=2)
    labels: list[str] | None = None
    max_length: int = Field(128, ge=8, le=4096)
    rounds: int = Field(10, ge=1, le=100000, description="T: number of federated rounds.")
    eval_every: int = Field(
        1,
        ge=1,
        le=100000,
        description="Clients evaluate a new prompt version only when its number is a multiple of this; "
        "version 0 (the initial prompt) and the final version (the last round's) are always evaluated.",
    )
    evaluators: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="How many clients evaluate each due prompt version: the first this many to enrol "
        "(revoked ones not counted). None: every client that holds evaluation examples. A client that "
        "enrolled saying it holds none (num_eval 0) is never asked.",
    )
    fraction: float = Field(1.0, description="C: fraction of clients selected per round, in (0, 1].")
    min_clients: int = Field(
        2, ge=1, le=1_000_000, description="Wait for this many clients; select at least this many."
    )
    expected_clients: int | None = Field(
        None, ge=1, description="Round 1 waits until this many clients enrolled (default: min_clients)."
    )
    quorum: int = Field(1, ge=1, description="Updates needed to aggregate at the deadline.")
    round_deadline_s: float = Field(600.0, gt=0, le=7 * 86400)
    availability_timeout_s: float = Field(
        600.0, gt=0, description="Clients unseen this long are not selected."
    )
    local_steps: int = Field(100, ge=1, le=1_000_000)
    local_epochs: float | None = Field(
        None,
        gt=0,
        le=1_000_000,
        description="Cap each client's local steps at this many passes over its own training data "
        "(FedAvg's E: ceil(E × n_k / batch_size) steps, at most local_steps), so that a client with a small "
        "shard does not over-fit it; none: every client trains local_steps.",
    )
    batch_size: int = Field(16, ge=1, le=4096)
    lr: float = Field(
        MEAN_POOL_LR,  # the default model's (_default_lr fills an unset lr by the rule)
        gt=0,
        le=100,
        description="The prompt's local learning rate; default with AdamW: 0.01 with mean-pool scoring (also "
        '"auto" on a checkpoint without an MLM head, the default MiniLM), else the paper\'s 0.3; with SGD: 1.0.',
    )
    grad_clip: float = Field(1.0, ge=0, le=1e6)
    local_optimizer: LocalOptimizerName = Field(
        LocalOptimizer.ADAMW,
        description="The optimiser of each client's local steps (a fresh one every round): adamw, or sgd "
        "(plain gradient steps, whose size follows the gradient's: under label skew the balanced loss "
        "then shrinks the steps of a client holding one label, where AdamW rescales them back to lr; "
        "docs/label-skew.md).",
    )
    aggregation: AggregationSpec = Field(default_factory=AggregationSpec)
    privacy: PrivacySpec | None = Field(None, description="Local DP of every update (none: off).")
    server_optimizer: ServerOptimizerSpec | None = Field(
        None,
        description="Server-side optimiser applied to each round's aggregate: fedavgm, fedadagrad, fedadam "
        "or fedyogi with its hyper-parameters (none or fedavg: the aggregate is the next prompt, plain FedAvg).",
    )
    drift_correction: DriftCorrectionSpec | None = Field(
        default_factory=label_skew_default,
        description="Client-drift correction: FedProx or SCAFFOLD in the local steps, the balanced "
        "local loss, entropy scaling of each update (null: none of them). Default: the balanced loss "
        "with entropy scaling, which kept every label-skew federation measured off a constant "
        "predictor (docs/label-skew.md).",
    )
    secure_aggregation: SecureAggregationSpec | None = Field(
        None,
        description="Secure aggregation of each round (none: updates are sent and stored in the clear).",
    )
    mode: ModeName = Field(
        Mode.SYNC,
        description="sync: rounds (a selection of C·K clients, one version from their updates); async: "
        "buffered asynchronous aggregation (FedBuff): at most `concurrency` clients train at once, each "
        "from the latest version when it asked, and every `buffer_size` accepted updates make one version "
        "from their staleness-weighted mean; `rounds` counts versions (docs/async.md).",
    )
    concurrency: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="async only: the most clients training at once (default: no limit but the clients "
        "enrolled). A client that uploaded is given a new task, from the latest version, as soon as that "
        "is a version it has not trained from.",
    )
    buffer_size: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="async only: B, the accepted updates that make a new version (default 2).",
    )
    max_staleness: int | None = Field(
        None,
        ge=0,
        le=1_000_000,
        description="async only: an update trained from a version more than this many versions behind "
        "the one its buffer builds on is refused (410) and the client trains again (default 10).",
    )
    server_lr: float | None = Field(
        None,
        gt=0,
        le=100,
        description="async only: the server's learning rate η on the buffered mean of the clients' "
        "staleness-weighted changes (default 1: with fresh updates, a buffer is FedAvg of its clients).",
    )
    seed: int = Field(0, ge=0, le=2**32 - 1)
    auto_advance: bool = True

    @model_validator(mode="before")
    @classmethod
    def _default_lr(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("lr") is None:
            model = data.get("model", DEFAULT_MODEL)
            optimizer = str(data.get("local_optimizer", LocalOptimizer.ADAMW))
            data = {**data, "lr": default_lr(str(data.get("scoring", Scoring.AUTO)), str(model), optimizer)}
        return data

    @model_validator(mode="after")
    def _check(self) -> FederationSpec:
        if not (0.0 < self.fraction <= 1.0) or math.isnan(self.fraction):
            raise ValueError(f"fraction C must be in (0, 1]; got {self.fraction}")
        if self.quorum > self.min_clients:
            raise ValueError(
                f"quorum ({self.quorum}) cannot exceed min_clients ({self.min_clients}): "
                "a round could never reach it"
            )
        if self.expected_clients is not None and self.expected_clients < self.min_clients:
            raise ValueError(
                f"expected_clients ({self.expected_clients}) must be at least min_clients ({self.min_clients})"
            )
        if any(not words or any(not w.strip() for w in words) for words in self.verbalizer):
            raise ValueError("every label needs at least one non-empty label word in the verbalizer")
        if self.labels is not None and len(self.labels) != len(self.verbalizer):
            raise ValueError(
                f"labels has {len(self.labels)} names but the verbalizer {len(self.verbalizer)} labels"
            )
        if self.secure_aggregation is not None:
            check_secure_aggregation(self.aggregation.name, self.min_clients)
        if self.scaffold:
            for clash, why in (
                (
                    self.secure_aggregation is not None,
                    "secure_aggregation (the coordinator would see each Δc_i)",
                ),
                (self.privacy is not None, "local DP (each Δc_i would leave the client unprotected)"),
                (
                    self.aggregation.name != AggregationRule.FEDAVG,
                    f"the {self.aggregation.name} rule (Δc_i are averaged)",
                ),
            ):
                if clash:
                    raise ValueError(
                        f"drift_correction scaffold cannot be combined with {why}; use fedprox instead"
                    )
        self._check_mode()
        if "[MASK]" not in self.template:
            raise ValueError("template needs a [MASK] slot where the label word is read")
        try:
            self.tensor_shapes()
        except MethodError as exc:
            raise ValueError(str(exc)) from None
        return self

    def _check_mode(self) -> None:
        """The async fields only in async mode (filled with their defaults there); what async refuses."""
        fields = ("concurrency", "buffer_size", "max_staleness", "server_lr")
        if self.mode == Mode.SYNC:
            given = [name for name in fields if getattr(self, name) is not None]
            if given:
                raise ValueError(f"{', '.join(given)}: only with mode 'async' (this federation is 'sync')")
            return
        for clash, why in (
            (
                self.secure_aggregation is not None,
                "secure_aggregation: its masks cancel only in the sum of one fixed set of clients "
                "that started from the same version, and a buffer holds whoever arrives, from any version",
            ),
            (
                self.scaffold,
                "drift_correction scaffold: its control variates assume every update starts "
                "from the round's version",
            ),
            (
                self.fraction != 1.0,
                "fraction: there is no per-round selection; limit the clients training "
                "at once with concurrency",
            ),
        ):
            if clash:
                raise ValueError(f"mode 'async' cannot be combined with {why}")
        self.buffer_size = self.buffer_size if self.buffer_size is not None else ASYNC_BUFFER_SIZE
        self.max_staleness = self.max_staleness if self.max_staleness is not None else ASYNC_MAX_STALENESS
        self.server_lr = self.server_lr if self.server_lr is not None else 1.0

    @property
    def buffered(self) -> bool:
        """Whether the federation aggregates asynchronously (mode async)."""
        return self.mode == Mode.ASYNC

    def method_config(self) -> MethodConfig:
        """The fields that fix the method's communicated tensors."""
        return MethodConfig(
            method=self.method,
            num_virtual_tokens=self.num_virtual_tokens,
            hidden_size=self.hidden_size,
            num_layers=self.num_layers,
            kv_size=self.kv_size,
            encoder_type=self.encoder_type,
            encoder_hidden_size=self.encoder_hidden_size,
            encoder_num_layers=self.encoder_num_layers,
            prefix_projection=self.prefix_projection,
        )

    def params_communicated(self) -> int:
        """Parameters one client sends (or receives) per round."""
        return num_parameters(self.method_config())

    def prompt_bytes(self) -> int:
        """Size of the communicated tensors as float32."""
        return 4 * sum(math.prod(shape) for shape in self.tensor_shapes().values())

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Names and shapes of the communicated tensors (per method; see shared.methods)."""
        return method_tensor_shapes(self.method_config())

    @property
    def heartbeat_s(self) -> float:
        """Seconds between a training worker's heartbeats (heartbeat_interval)."""
        return heartbeat_interval(self.availability_timeout_s)

    @property
    def stale_after_s(self) -> float:
        """A site silent this long (STALE_HEARTBEATS heartbeats missed) is shown stale."""
        return STALE_HEARTBEATS * self.heartbeat_s

    @property
    def scaffold(self) -> bool:
        """Whether clients keep SCAFFOLD control variates."""
        return self.drift_correction is not None and self.drift_correction.scaffold

    def update_shapes(self) -> dict[str, tuple[int, ...]]:
        """Names and shapes of an uploaded update: the prompt's tensors, and with SCAFFOLD each one's
        control-variate change under 'control/'."""
        shapes = self.tensor_shapes()
        if self.scaffold:
            shapes = {**shapes, **drift.prefixed(shapes)}
        return shapes

    def num_selected(self, available: int) -> int:
        """How many clients a round selects: max(ceil(C*K), min_clients), at most K."""
        return min(available, max(math.ceil(self.fraction * available - 1e-9), self.min_clients))


ASYNC_BUFFER_SIZE = 2  # mode async: updates per version, unless buffer_size says otherwise
ASYNC_MAX_STALENESS = 10  # mode async: versions an update may lag, unless max_staleness says otherwise
STALE_HEARTBEATS = 3  # heartbeats a site may miss before it is shown stale


def heartbeat_interval(availability_timeout_s: float) -> float:
    """Seconds between a training worker's heartbeats, and the coordinator's granularity of a
    client's last-seen time: a tenth of the federation's availability timeout, at most a minute."""
    return min(60.0, availability_timeout_s / 10)


def initial_prompt(spec: FederationSpec) -> dict[str, np.ndarray]:
    """Version 0 of the global prompt: seeded Gaussian, identical on every machine."""
    rng = np.random.default_rng([spec.seed, 0xF0])
    return {
        name: (rng.standard_normal(shape) * spec.init_std).astype(np.float32)
        for name, shape in spec.tensor_shapes().items()
    }
