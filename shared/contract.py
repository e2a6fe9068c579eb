"""The REST API's answers as both sides read them, defined once: the coordinator's response models (its
OpenAPI schema is generated from these, coordinator/api/schemas.py) and what CoordinatorClient returns
(shared/client.py validates each answer into its model).

Every model allows members it does not describe (extra="allow"): a field a newer coordinator adds
reaches a client before it is described here, and an older client ignores it. The task a worker polls
for is one model per kind, told apart by "kind"; its fields are the ones the coordinator has always
sent, so a worker of either age understands it.

The prompt itself travels as a safetensors file (shared/wire.py), not as one of these.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fedprompt.shared.vocab import FederationState, RoundState, SecureStage, TaskKind
from pydantic import BaseModel, ConfigDict, Field, RootModel

__all__ = [
    "BestVersion",
    "ClientCounts",
    "DoneTask",
    "Enrolled",
    "EnrolmentToken",
    "EvaluateTask",
    "EvaluationStored",
    "EvaluationSummary",
    "FederationStateName",
    "FederationStatus",
    "InitialPrompt",
    "ModelParameters",
    "Open",
    "Participant",
    "RoundStateShown",
    "RoundSummary",
    "SecaggStored",
    "SecaggTask",
    "SecaggTaskStage",
    "Task",
    "TaskAnswer",
    "TaskKindName",
    "TrainConfig",
    "TrainTask",
    "UploadReceipt",
]

# Sets of the vocabulary's names (shared/vocab.py) as the API shows them: a round as committed (its
# aggregating state lasts only inside the transaction that closes it), a federation's state, a task's
# kind, and the stages a secagg task asks a client to answer (the masked stage's task is a train task).
FederationStateName = Literal[
    FederationState.WAITING, FederationState.RUNNING, FederationState.PAUSED, FederationState.COMPLETED
]
RoundStateShown = Literal[RoundState.OPEN, RoundState.CLOSED, RoundState.FAILED]
TaskKindName = Literal[TaskKind.EVALUATE, TaskKind.TRAIN, TaskKind.SECAGG, TaskKind.DONE]
SecaggTaskStage = Literal[SecureStage.KEYS, SecureStage.SHARES, SecureStage.CONSISTENCY, SecureStage.UNMASK]


class Open(BaseModel):
    # no docstring: a model's docstring becomes its schema's description, and this one has no schema
    model_config = ConfigDict(extra="allow")


# -- a federation's status -----------------------------------------------------------------------


class Participant(Open):
    client_id: int
    uploaded: bool


class EvaluationSummary(Open):
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


class BestVersion(Open):
    """The federation's best version by its stated rule."""

    version: int
    metric: Literal["macro_f1", "accuracy"]
    value: float
    rule: str
    evaluation: EvaluationSummary


class RoundSummary(Open):
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


class ClientCounts(Open):
    enrolled: int
    active: int
    available: int


class BufferClient(Open):
    client_id: int
    name: str
    updates: int = Field(..., description="Its updates counted in a buffer so far.")
    updates_per_minute: float | None = Field(
        None, description="Between its first and its last counted update (none below two)."
    )


class BufferStatus(Open):
    buffer_size: int
    concurrency: int | None
    max_staleness: int
    server_lr: float
    open_buffer: int | None = Field(
        ..., description="The round number (= the version it writes) of the open buffer."
    )
    filled: int = Field(..., description="Updates in the open buffer so far.")
    tasks_held: int = Field(
        ..., description="Train tasks handed out and not uploaded (each holds a concurrency slot)."
    )
    training: list[int] = Field(..., description="The clients holding them.")
    staleness: dict[str, int] = Field(
        ..., description="Updates counted so far by staleness τ (versions behind)."
    )
    clients: list[BufferClient]


class FederationStatus(Open):
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
    buffer: BufferStatus | None = Field(
        None, description="Mode async only: the buffers and the clients' throughput."
    )
    spec: dict[str, Any]
    created_at: float


class InitialPrompt(Open):
    version: Literal[0]
    sha256: str


# -- enrolment -----------------------------------------------------------------------------------


class EnrolmentToken(Open):
    token: str = Field(..., description="Shown only in this response.")
    id: int
    expires_at: float | None
    max_uses: int | None


class Enrolled(Open):
    client_id: int
    token: str = Field(..., description="The client token; shown only in this response.")
    federation_id: int
    spec: dict[str, Any]


class ModelParameters(Open):
    model_parameters: int | None = Field(
        ...,
        description="The federation's full-model figure: the spec's params_full_model, else the first stated.",
    )


# -- a worker's task -----------------------------------------------------------------------------


class TrainConfig(Open):
    """The spec's local training settings, as a train task repeats them (the worker holds the spec too)."""

    local_steps: int
    local_epochs: float | None = None
    batch_size: int
    lr: float
    grad_clip: float = 1.0
    local_optimizer: str = "adamw"
    seed: int = 0
    drift_correction: dict[str, Any] | None = None


class _Task(Open):
    # the kind first, as on the wire; each kind's model narrows it to its own name
    kind: TaskKindName
    round: int
    version: int


class EvaluateTask(_Task):
    """Evaluate a prompt version on the local held-out data and report the metrics."""

    kind: Literal[TaskKind.EVALUATE]
    sha256: str


class TrainTask(_Task):
    """Train from the round's base version and upload the update (a masked one in a secure round)."""

    kind: Literal[TaskKind.TRAIN]
    attempt: int
    sha256: str
    deadline_at: float
    config: TrainConfig
    secure_aggregation: dict[str, Any] | None = Field(
        None, description="A secure round's train task: what the masked upload needs."
    )


class SecaggTask(_Task):
    """Answer a secure round's stage (docs/secure-aggregation.md); the stage's own members ride along."""

    kind: Literal[TaskKind.SECAGG]
    stage: SecaggTaskStage
    attempt: int
    deadline_at: float


class DoneTask(_Task):
    """The federation has completed: nothing more to do."""

    kind: Literal[TaskKind.DONE]


TaskAnswer = Annotated[EvaluateTask | TrainTask | SecaggTask | DoneTask, Field(discriminator="kind")]


class Task(RootModel[TaskAnswer]):
    """What a client should do next: evaluate a version, train for a round, answer a secure round's
    stage (secagg: keys, shares or unmask; docs/secure-aggregation.md), or stop."""


# -- receipts ------------------------------------------------------------------------------------


class UploadReceipt(Open):
    """What an upload answers (the body of the API's answer); an identical retry answers the same."""

    round: int
    attempt: int
    client_id: int
    sha256: str
    num_samples: int  # the weight stored: the declared figure, at most the client's enrolled one
    size: int


class EvaluationStored(Open):
    version: int
    stored: bool = Field(..., description="False when this client had already reported this version.")


class SecaggStored(Open):
    """A stage answer's receipt."""

    round: int
    attempt: int
    stage: SecaggTaskStage
    stored: bool = Field(..., description="False when this client had already sent exactly this.")
