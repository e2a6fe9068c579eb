"""Enrolment tokens and clients."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response
from pydantic import BaseModel, ConfigDict, Field

from coordinator.api.deps import AdminDep, EnrolmentDep, IdPath, ServiceDep
from coordinator.api.jsonbody import BoundedJSONRoute
from coordinator.api.problems import API_ERRORS, problem_responses
from coordinator.api.schemas import ClientInfo, Enrolled, EnrolmentToken
from coordinator.db import MAX_ID
from shared.spec import NAME_PATTERN

router = APIRouter(
    prefix="/api/v1/federations/{fid}", tags=["clients"], responses=API_ERRORS, route_class=BoundedJSONRoute
)


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
    num_samples: int = Field(..., ge=0, le=MAX_ID)
    info: dict[str, Any] = Field(default_factory=dict, description="e.g. model_fingerprint, device")


@router.post("/enrollment-tokens", status_code=201, dependencies=[AdminDep], response_model=EnrolmentToken)
def create_token(fid: IdPath, service: ServiceDep, body: TokenRequest | None = None) -> dict[str, Any]:
    """Issue an enrolment token; it is shown only in this response."""
    body = body or TokenRequest()
    token, row = service.create_enrollment_token(fid, expires_in_s=body.expires_in_s, max_uses=body.max_uses)
    return {"token": token, "id": row.id, "expires_at": row.expires_at, "max_uses": row.max_uses}


@router.post(
    "/clients",
    status_code=201,
    response_model=Enrolled,
    responses=problem_responses(409, e409="the model's fingerprint differs"),
)
def enroll(fid: IdPath, body: EnrollRequest, token: EnrolmentDep, service: ServiceDep) -> dict[str, Any]:
    """Enrol with an enrolment token (Bearer); returns a client id and a client token, shown once."""
    client, client_token = service.enroll(
        fid, token, name=body.name, num_samples=body.num_samples, info=body.info
    )
    return {
        "client_id": client.id,
        "token": client_token,
        "federation_id": fid,
        "spec": service.federation_spec(fid),
    }


@router.get("/clients", dependencies=[AdminDep], response_model=list[ClientInfo])
def list_clients(fid: IdPath, service: ServiceDep) -> list[dict[str, Any]]:
    """Every enrolled client with its activity."""
    return service.list_clients(fid)


@router.delete("/clients/{cid}", status_code=204, dependencies=[AdminDep])
def revoke(fid: IdPath, cid: IdPath, service: ServiceDep) -> Response:
    """Revoke a client: its token stops working; it is never selected again."""
    service.revoke_client(fid, cid)
    return Response(status_code=204)
