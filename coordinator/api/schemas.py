"""The REST API's contract: request parameters and bodies, and what each route answers.

Requests are strict (``true`` is not 1, ``"5"`` is not 5) and refuse unknown members. The services
return plain dicts; the response models are the contract that FastAPI checks them against (a route
whose answer does not fit fails loudly in tests rather than reaching a client) and that
schemathesis validates every answer against. Each allows extra members, so a field added to a
service's answer reaches clients before it is described here.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Body, Path
from fedprompt.coordinator.db import MAX_ID
from fedprompt.coordinator.logic.specs import validate_spec
from fedprompt.coordinator.logic.uploads import UploadReceipt
from fedprompt.shared.spec import NAME_PATTERN, FederationSpec
from fedprompt.shared.vocab import FederationState, RoundState, SecureStage, TaskKind
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainValidator

__all__ = ["UploadReceipt"]  # an upload's answer: defined once, with the upload's checks

# Sets of the vocabulary's names (shared/vocab.py) as the API shows them: a round as committed (its
# aggregating state lasts only inside the transaction that closes it), a federation's state, a task's
# kind, and the stages a secagg task asks a client to answer (the masked stage's task is a train task).
FederationStateName = Literal[
    FederationState.WAITING, FederationState.RUNNING, FederationState.PAUSED, FederationState.COMPLETED
]
RoundStateShown = Literal[RoundState.OPEN, RoundState.CLOSED, RoundState.FAILED]
TaskKindName = Literal[TaskKind.EVALUATE, TaskKind.TRAIN, TaskKind.SECAGG, TaskKind.DONE]
SecaggTaskStage = Literal[SecureStage.KEYS, SecureStage.SHARES, SecureStage.CONSISTENCY, SecureStage.UNMASK]

# -- request parameters and bodies ---------------------------------------------------------------

# The largest model a worker may state at enrolment: 10 trillion parameters, well above any PLM.
MAX_MODEL_PARAMETERS = 10**13


def ascii_decimal(value: Any) -> Any:
    """A path id as written: ASCII digits only (``1.0``, ``+1``, ``1_0``, `` 1`` are not ids)."""
    if isinstance(value, str) and not (value.isascii() and value.isdigit() and len(value) <= 10):
        raise ValueError("an id is 1 to 10 ASCII digits (0-9), e.g. 12")
    return value


IdPath = Annotated[
    int,
    Path(ge=0, le=MAX_ID, description="A non-negative 32-bit id or number (ASCII digits)."),
    BeforeValidator(ascii_decimal),
]
# A prompt version as a path or query parameter: a number (ASCII digits) or 'latest'.
VERSION_PATTERN = r"^(?:latest|best|[0-9]{1,10})$"
VersionPath = Annotated[
    str,
    Path(pattern=VERSION_PATTERN, description="A version number, 'latest' or 'best' (the best evaluated)."),
]

# The body's schema is FederationSpec's (extra properties refused: additionalProperties false); it is
# checked by validate_spec, strictly, and a refusal reads "invalid federation spec: …" (422).
SpecBody = Annotated[
    FederationSpec,
    PlainValidator(validate_spec, json_schema_input_type=FederationSpec),
    Body(description="A FederationSpec", examples=[FederationSpec().model_dump()]),
]


class TokenRequest(BaseModel):
    """Options of a new enrolment token."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)  # true is not 1
    expires_in_s: float | None = Field(
        None, gt=0, le=10 * 365 * 86400, description="Seconds until the token expires."
    )
    max_uses: int | None = Field(None, ge=1, le=MAX_ID, description="How many enrolments the token allows.")


class EnrollRequest(BaseModel):
    """What a worker says about itself when it enrols."""

    model_config = ConfigDict(extra="forbid", strict=True)
    name: str = Field(
        ..., min_length=1, max_length=200, pattern=NAME_PATTERN, description="No control characters."
    )
    num_samples: int = Field(
        ..., ge=0, le=MAX_ID, description="Training samples; the most an update of this client may weigh."
    )
    info: dict[str, Any] = Field(default_factory=dict, description="e.g. model_fingerprint, device")
    model_parameters: int | None = Field(
        None,
        ge=1,
        le=MAX_MODEL_PARAMETERS,
        description="Parameters of the worker's whole frozen model. The federation keeps the first figure "
        "stated, and only when its spec sets no params_full_model: the ledger's full fine-tuning reference.",
    )


class ModelParametersStatement(BaseModel):
    """A worker's statement of its frozen model's size, made once it has loaded the model the spec names."""

    model_config = ConfigDict(extra="forbid", strict=True)
    model_parameters: int = Field(
        ...,
        ge=1,
        le=MAX_MODEL_PARAMETERS,
        description="Parameters of the worker's whole frozen model, as at enrolment.",
    )


class EvaluationReport(BaseModel):
    """A client's metrics of a global prompt version on its local held-out data."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)
    version: int | None = Field(
        None, ge=0, le=MAX_ID, description="Prompt version evaluated; default: the round number."
    )
    num_samples: int = Field(..., ge=1, le=MAX_ID)
    accuracy: float = Field(..., ge=0, le=1)
    loss: float | None = Field(None, ge=0)
    metrics: dict[str, float] = Field(default_factory=dict)


# -- responses -----------------------------------------------------------------------------------


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class Health(_Open):
    status: str


class Participant(_Open):
    client_id: int
    uploaded: bool


class EvaluationSummary(_Open):
    """Sample-weighted metrics of a prompt version over the clients that reported (extra metrics too)."""

    version: int
    clients: int
    num_samples: int
    accuracy: float
    loss: float | None = None
    macro_f1: float | None = Field(None, description="From the summed confusion matrices, when reported.")
    collapsed: bool = Field(
        False,
        description="The predictions fell to one class (at least 99 % of the examples predicted as one "
        "label while the examples hold two or more): a constant predictor.",
    )


class SiteEvaluation(_Open):
    client_id: int
    name: str
    num_samples: int
    accuracy: float
    loss: float | None = None
    macro_f1: float | None = None
    per_class_accuracy: list[float | None] | None = None


class SiteSpread(_Open):
    sites: int
    min: float
    max: float
    mean: float = Field(..., description="Unweighted mean of the sites' accuracies.")
    std: float = Field(..., description="Population standard deviation of the sites' accuracies.")


class SiteEvaluations(_Open):
    """Each site's own evaluation of a version: where the shared prompt works and where it does not."""

    version: int
    sites: list[SiteEvaluation]
    spread: SiteSpread | None


class BestVersion(_Open):
    """The federation's best version by its stated rule."""

    version: int
    metric: Literal["macro_f1", "accuracy"]
    value: float
    rule: str
    evaluation: EvaluationSummary


class RoundSummary(_Open):
    round: int
    attempt: int
    state: RoundStateShown
    base_version: int
    result_version: int | None
    opened_at: float
    deadline_at: float
    closed_at: float | None
    closed_by: str | None
    seconds: float | None
    failure_reason: str | None
    participants: list[Participant]
    stats: dict[str, Any] | None
    evaluation: EvaluationSummary | None
    secure_aggregation: dict[str, Any] | None = Field(
        None,
        description="A secure round attempt's stage (keys, shares, masked, unmask, done, failed), the "
        "clients that completed each stage and the stage each missing client did not complete.",
    )


class ClientCounts(_Open):
    enrolled: int
    active: int
    available: int


class FederationStatus(_Open):
    id: int
    name: str
    state: FederationStateName
    paused: bool
    current_round: int
    rounds_total: int
    latest_version: int
    clients: ClientCounts
    open_round: RoundSummary | None
    latest: RoundSummary | None
    best_version: BestVersion | None = Field(
        None,
        description="The best evaluated version ('best' in prompt and export paths); none before any evaluation.",
    )
    spec: dict[str, Any]
    created_at: float


class ClientInfo(_Open):
    id: int
    name: str
    num_samples: int
    enrolled_at: float
    last_seen_at: float
    revoked: bool
    state: Literal["live", "training", "stale", "gone", "revoked"] = Field(
        "live",
        description="live (heard from recently), training (its heartbeat says so), stale (three "
        "heartbeats missed), gone (unseen for availability_timeout_s: no longer selected), revoked.",
    )
    activity: dict[str, Any] | None = Field(None, description="Its last heartbeat: phase, round, step, at.")
    rounds_selected: int
    updates: int
    info: dict[str, Any]


class Event(_Open):
    id: int
    kind: str
    round: int | None
    message: str
    at: float


class Activity(BaseModel):
    """A worker's heartbeat: what it is doing (sent every heartbeat_s while it trains)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    phase: Literal["training", "idle"]
    round: int | None = Field(None, ge=1, le=2_147_483_647)
    step: int | None = Field(None, ge=0, le=2_147_483_647)
    total_steps: int | None = Field(None, ge=0, le=2_147_483_647)


class ModelParameters(_Open):
    model_parameters: int | None = Field(
        ...,
        description="The federation's full-model figure: the spec's params_full_model, else the first stated.",
    )


class EnrolmentToken(_Open):
    token: str = Field(..., description="Shown only in this response.")
    id: int
    expires_at: float | None
    max_uses: int | None


class Enrolled(_Open):
    client_id: int
    token: str = Field(..., description="The client token; shown only in this response.")
    federation_id: int
    spec: dict[str, Any]


class Task(_Open):
    """What a client should do next: evaluate a version, train for a round, answer a secure round's
    stage (secagg: keys, shares or unmask; docs/secure-aggregation.md), or stop."""

    kind: TaskKindName
    round: int
    version: int
    sha256: str | None = None
    attempt: int | None = None
    deadline_at: float | None = None
    config: dict[str, Any] | None = None
    stage: SecaggTaskStage | None = None
    secure_aggregation: dict[str, Any] | None = Field(
        None, description="A secure round's train task: what the masked upload needs."
    )


class EvaluationStored(_Open):
    version: int
    stored: bool = Field(..., description="False when this client had already reported this version.")


class InitialPrompt(_Open):
    version: Literal[0]
    sha256: str
