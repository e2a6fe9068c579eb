"""The project's vocabulary: every closed set of names that the spec, the wire, the database and the code
compare against, defined once.

Each is a `StrEnum`, so a member equals its text ("open" == RoundState.OPEN), is stored and sent as
that text, and pydantic models typed with it validate and document (OpenAPI `enum`) the same values.
Code that checks or compares one of these names uses the member, never the literal.
"""

from __future__ import annotations

from enum import StrEnum


class Family(StrEnum):
    """How a model family reads a prompt and scores labels (worker/engine/families/)."""

    MASKED_LM = "masked_lm"
    CAUSAL_LM = "causal_lm"
    SEQ2SEQ = "seq2seq"


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
    """Server-side optimisers of a round's aggregate (coordinator/logic/server_optim.py registers each)."""

    FEDAVG = "fedavg"
    FEDAVGM = "fedavgm"
    FEDADAGRAD = "fedadagrad"
    FEDADAM = "fedadam"
    FEDYOGI = "fedyogi"


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
