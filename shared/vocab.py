"""The project's vocabulary: every closed set of names that the spec, the wire, the database and the code
compare against, defined once.

Each is a `StrEnum`, so a member equals its text ("open" == RoundState.OPEN), is stored and sent as
that text, and pydantic models typed with it validate and document (OpenAPI `enum`) the same values.
Code that checks or compares one of these names uses the member, never the literal. A pydantic field
that takes one of them from JSON or a dict is `Annotated[TheEnum, ByText()]`: pydantic's strict
validation (the API's) takes only a member from Python input, never its text.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import GetCoreSchemaHandler
from pydantic_core import PydanticCustomError, core_schema


def choices(names: Collection[str], *, quote: bool = True) -> str:
    """The names as pydantic's messages list a Literal's values, "'a', 'b' or 'c'" (or a, b or c)."""
    quoted = [repr(str(name)) if quote else str(name) for name in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


@dataclass(frozen=True)
class ByText:
    """A StrEnum field's pydantic metadata, `Annotated[TheEnum, ByText()]`: a member, or a member's text
    (strict validation included), is taken as the member; anything else is refused with "Input should
    be 'a', 'b' or 'c'", the message of a Literal of the values. The JSON schema is the enum's.

    `names`, read at each validation, are the names taken (default: the members'); one that is no
    member is kept, and written, as its text (a name registered beside the vocabulary, as in a test)."""

    names: Collection[str] | None = None

    def __get_pydantic_core_schema__(
        self, source: type[StrEnum], handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        names = self.names

        def validate(value: Any, inner: core_schema.ValidatorFunctionWrapHandler) -> Any:
            if isinstance(value, source):
                return inner(value)
            accepted = [m.value for m in source] if names is None else list(names)
            if isinstance(value, str) and value in accepted:
                return source._value2member_map_.get(value, value)
            raise PydanticCustomError("enum", "Input should be {expected}", {"expected": choices(accepted)})

        def serialize(value: Any, inner: core_schema.SerializerFunctionWrapHandler) -> Any:
            return inner(value) if isinstance(value, source) else str(value)

        return core_schema.no_info_wrap_validator_function(
            validate,
            handler(source),
            serialization=core_schema.wrap_serializer_function_ser_schema(serialize),
        )


def _one_row_each(table: Mapping[str, Any], names: type[StrEnum], label: str) -> None:
    """A table beside a vocabulary holds one row per member, in the member's order (checked on import)."""
    if list(table) != list(names):
        raise RuntimeError(f"{label} needs one row per {names.__name__}, in its order")


class Family(StrEnum):
    """How a model family reads a prompt and scores labels (worker/engine/families/)."""

    MASKED_LM = "masked_lm"
    CAUSAL_LM = "causal_lm"
    SEQ2SEQ = "seq2seq"


# How PEFT wraps each family's models (its task type), one row per Family: the one family fact the
# coordinator needs without torch (the PEFT export). A new family: its member above, its row here, its
# adapter in worker/engine/families/.
PEFT_TASK_TYPES: dict[str, str] = {
    Family.MASKED_LM: "FEATURE_EXTRACTION",
    Family.CAUSAL_LM: "CAUSAL_LM",
    Family.SEQ2SEQ: "SEQ_2_SEQ_LM",
}
_one_row_each(PEFT_TASK_TYPES, Family, "PEFT_TASK_TYPES")


class Method(StrEnum):
    """The parameter-efficient method whose parameters are the federated prompt."""

    PROMPT_TUNING = "prompt_tuning"
    P_TUNING = "p_tuning"
    PREFIX_TUNING = "prefix_tuning"


class EncoderType(StrEnum):
    """P-tuning's prompt encoder."""

    MLP = "mlp"
    LSTM = "lstm"


class Scoring(StrEnum):
    """How label scores are read from the frozen model."""

    AUTO = "auto"
    TIED_EMBEDDINGS = "tied-embeddings"
    MEAN_POOL = "mean-pool"


class ServerOptimizer(StrEnum):
    """Server-side optimisers of a round's aggregate (hyper-parameters and their defaults:
    SERVER_OPTIMIZER_DEFAULTS, shared/vocab.py; update rules: coordinator/logic/server_optim.py)."""

    FEDAVG = "fedavg"
    FEDAVGM = "fedavgm"
    FEDADAGRAD = "fedadagrad"
    FEDADAM = "fedadam"
    FEDYOGI = "fedyogi"


# The hyper-parameters each server optimiser takes and their defaults, one row per ServerOptimizer (a
# new optimiser: its member above, its row here, its update rule registered in
# coordinator/logic/server_optim.py). Flower's strategies of the same names (FedAvgM:
# server_learning_rate, server_momentum; FedAdagrad/FedAdam/FedYogi: eta, beta_1, beta_2, tau), except
# FedAvgM's momentum (Flower: 0, which is FedAvg; here 0.9) and tau (Flower's current default 1e-3 for
# all three; its older flwr.server.strategy FedAdam and FedAdagrad default to 1e-9).
SERVER_OPTIMIZER_DEFAULTS: dict[str, dict[str, float]] = {
    ServerOptimizer.FEDAVG: {},
    ServerOptimizer.FEDAVGM: {"lr": 1.0, "momentum": 0.9},
    ServerOptimizer.FEDADAGRAD: {"lr": 0.1, "beta1": 0.0, "tau": 1e-3},
    ServerOptimizer.FEDADAM: {"lr": 0.1, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3},
    ServerOptimizer.FEDYOGI: {"lr": 0.01, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3},
}
_one_row_each(SERVER_OPTIMIZER_DEFAULTS, ServerOptimizer, "SERVER_OPTIMIZER_DEFAULTS")


class LocalOptimizer(StrEnum):
    """The optimiser of a client's local steps (worker/engine/engine.py)."""

    ADAMW = "adamw"
    SGD = "sgd"


class Mode(StrEnum):
    """How a federation turns updates into prompt versions (docs/async.md)."""

    SYNC = "sync"  # rounds: a selection, every selected client's update (or the deadline), one version
    ASYNC = "async"  # buffered (FedBuff): clients train from the version they pulled; every B updates, one


class DriftCorrection(StrEnum):
    """Client-drift correction of the local steps (shared/drift.py)."""

    NONE = "none"
    FEDPROX = "fedprox"
    SCAFFOLD = "scaffold"


class RoundState(StrEnum):
    """A round's life: open → aggregating → closed, or → failed (coordinator/logic/round_states.py)."""

    OPEN = "open"
    AGGREGATING = "aggregating"
    CLOSED = "closed"
    FAILED = "failed"


class FederationState(StrEnum):
    """A federation's life: waiting (for clients or its next round) ⇄ running (a round open), paused by
    an operator, completed after its last round."""

    WAITING = "waiting"
    RUNNING = "running"
    PAUSED = "paused"
    COMPLETED = "completed"


class SecureStage(StrEnum):
    """The stages of a secure-aggregation round (docs/secure-aggregation.md), then its end."""

    KEYS = "keys"
    SHARES = "shares"
    MASKED = "masked"
    CONSISTENCY = "consistency"
    UNMASK = "unmask"
    DONE = "done"
    FAILED = "failed"


class TaskKind(StrEnum):
    """What a client's task poll answers."""

    EVALUATE = "evaluate"
    TRAIN = "train"
    SECAGG = "secagg"
    DONE = "done"


class AggregationRule(StrEnum):
    """Aggregation rules (coordinator/logic/aggregation.py and robust.py register each)."""

    FEDAVG = "fedavg"
    MEDIAN = "median"
    TRIMMED_MEAN = "trimmed_mean"
    KRUM = "krum"
    MULTI_KRUM = "multi_krum"
    NORM_BOUND = "norm_bound"
    STATS_FILTER = "stats_filter"
