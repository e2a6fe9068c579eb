"""The REST API's contract: request parameters and bodies, and what each route answers.

Requests are strict (``true`` is not 1, ``"5"`` is not 5) and refuse unknown members. The services
return plain dicts; the response models are the contract that FastAPI checks them against (a route
whose answer does not fit fails loudly in tests rather than reaching a client) and that
schemathesis validates every answer against. Each allows extra members, so a field added to a
service's answer reaches clients before it is described here. The answers a client reads (a
federation's status, enrolment, the task, the receipts) are defined once in shared/contract.py, the
models CoordinatorClient validates them into; they are re-exported here with the rest.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Body, Path
from fedprompt.coordinator.logic.specs import validate_spec
from fedprompt.coordinator.persistence.db import MAX_ID
from fedprompt.shared.contract import (
    BestVersion,
    ClientCounts,
    Enrolled,
    EnrolmentToken,
    EvaluationStored,
    EvaluationSummary,
    FederationStateName,
    FederationStatus,
    InitialPrompt,
    ModelParameters,
    Open,
    Participant,
    RoundStateShown,
    RoundSummary,
    SecaggStored,
    SecaggTaskStage,
    Task,
    TaskKindName,
    UploadReceipt,
)
from fedprompt.shared.spec import NAME_PATTERN, FederationSpec
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainValidator

__all__ = [
    "BestVersion",
    "ClientCounts",
    "Enrolled",
    "EnrolmentToken",
    "EvaluationStored",
    "EvaluationSummary",
    "FederationStateName",
    "FederationStatus",
    "InitialPrompt",
    "ModelParameters",
    "Participant",
    "RoundStateShown",
    "RoundSummary",
    "SecaggStored",
    "SecaggTaskStage",
    "Task",
    "TaskKindName",
    "UploadReceipt",
]

# -- request parameters and bodies ---------------------------------------------------------------

# The largest model a worker may state at enrolment: 10 trillion parameters, well above any PLM.
MAX_MODEL_PARAMETERS = 10**13


def is_id_text(text: str) -> bool:
    """Whether a path id is written as one: 1 to 10 ASCII digits (``1.0``, ``+1``, ``1_0``, `` 1``,
    ``²`` are not)."""
    return text.isascii() and text.isdigit() and len(text) <= 10


def ascii_decimal(value: Any) -> Any:
    """A path id as written: ASCII digits only (is_id_text)."""
    if isinstance(value, str) and not is_id_text(value):
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


class Health(Open):
    status: str


class SiteEvaluation(Open):
    client_id: int
    name: str
    num_samples: int
    accuracy: float
    loss: float | None = None
    macro_f1: float | None = None
    per_class_accuracy: list[float | None] | None = None


class SiteSpread(Open):
    sites: int
    min: float
    max: float
    mean: float = Field(..., description="Unweighted mean of the sites' accuracies.")
    std: float = Field(..., description="Population standard deviation of the sites' accuracies.")


class SiteEvaluations(Open):
    """Each site's own evaluation of a version: where the shared prompt works and where it does not."""

    version: int
    sites: list[SiteEvaluation]
    spread: SiteSpread | None


class ClientInfo(Open):
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


class Event(Open):
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
