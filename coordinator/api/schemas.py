"""Response models of the REST API: what each route answers, as documented in its OpenAPI.

The services return plain dicts; these models are the contract that FastAPI checks them against
(a route whose answer does not fit fails loudly in tests rather than reaching a client) and that
schemathesis validates every answer against. Each allows extra members, so a field added to a
service's answer reaches clients before it is described here.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


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


class RoundSummary(_Open):
    round: int
    attempt: int
    state: Literal["open", "closed", "failed"]
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


class ClientCounts(_Open):
    enrolled: int
    active: int
    available: int


class FederationStatus(_Open):
    id: int
    name: str
    state: str
    paused: bool
    current_round: int
    rounds_total: int
    latest_version: int
    clients: ClientCounts
    open_round: RoundSummary | None
    latest: RoundSummary | None
    spec: dict[str, Any]
    created_at: float


class ClientInfo(_Open):
    id: int
    name: str
    num_samples: int
    enrolled_at: float
    last_seen_at: float
    revoked: bool
    rounds_selected: int
    updates: int
    info: dict[str, Any]


class Event(_Open):
    id: int
    kind: str
    round: int | None
    message: str
    at: float


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
    """What a client should do next: evaluate a version, train for a round, or stop."""

    kind: Literal["evaluate", "train", "done"]
    round: int
    version: int
    sha256: str | None = None
    attempt: int | None = None
    deadline_at: float | None = None
    config: dict[str, Any] | None = None


class UploadReceipt(_Open):
    round: int
    attempt: int
    client_id: int
    sha256: str
    num_samples: int
    size: int


class EvaluationStored(_Open):
    version: int
    stored: bool = Field(..., description="False when this client had already reported this version.")


class InitialPrompt(_Open):
    version: Literal[0]
    sha256: str
