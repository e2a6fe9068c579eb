"""Enrolment tokens and clients."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fedprompt.coordinator.api.deps import AdminDep, ClientDep, EnrolmentDep, ServiceDep, SettingsDep
from fedprompt.coordinator.api.jsonbody import BoundedJSONRoute
from fedprompt.coordinator.api.problems import API_ERRORS, problem_responses
from fedprompt.coordinator.api.schemas import (
    Activity,
    ClientInfo,
    Enrolled,
    EnrollRequest,
    EnrolmentToken,
    IdPath,
    ModelParameters,
    ModelParametersStatement,
    TokenRequest,
)
from fedprompt.coordinator.api.tls import enrolment_certificate
from fedprompt.coordinator.hosting.paths import FEDERATION

router = APIRouter(prefix=FEDERATION, tags=["clients"], responses=API_ERRORS, route_class=BoundedJSONRoute)


@router.post("/enrollment-tokens", status_code=201, dependencies=[AdminDep], response_model=EnrolmentToken)
def create_token(fid: IdPath, service: ServiceDep, body: TokenRequest | None = None) -> dict[str, Any]:
    """Issue an enrolment token; it is shown only in this response."""
    body = body or TokenRequest()
    token, row = service.enrolment.create_enrollment_token(
        fid, expires_in_s=body.expires_in_s, max_uses=body.max_uses
    )
    return {"token": token, "id": row.id, "expires_at": row.expires_at, "max_uses": row.max_uses}


@router.post(
    "/clients",
    status_code=201,
    response_model=Enrolled,
    responses=problem_responses(409, e409="the model's fingerprint differs"),
)
def enroll(
    fid: IdPath,
    body: EnrollRequest,
    token: EnrolmentDep,
    service: ServiceDep,
    settings: SettingsDep,
    request: Request,
) -> dict[str, Any]:
    """Enrol with an enrolment token (Bearer); returns a client id and a client token, shown once.
    Under mutual TLS the connection's client certificate is bound to the new client."""
    client, client_token = service.enrolment.enroll(
        fid,
        token,
        name=body.name,
        num_samples=body.num_samples,
        info=body.info,
        model_parameters=body.model_parameters,
        tls_fingerprint=enrolment_certificate(request, settings),
    )
    return {
        "client_id": client.id,
        "token": client_token,
        "federation_id": fid,
        "spec": service.federations.federation_spec(fid),
    }


@router.put("/model-parameters", response_model=ModelParameters)
def state_model_parameters(
    fid: IdPath, body: ModelParametersStatement, client: ClientDep, service: ServiceDep
) -> dict[str, Any]:
    """State the loaded model's parameter count, as at enrolment (a worker learns its model from the spec
    after enrolling); the answer is the federation's figure, which the first statement sets."""
    del fid  # the client's federation: require_client checked it
    return {"model_parameters": service.enrolment.state_model_parameters(client, body.model_parameters)}


@router.put("/activity", status_code=204)
def report_activity(fid: IdPath, body: Activity, client: ClientDep, service: ServiceDep) -> Response:
    """A worker's heartbeat while it trains (every heartbeat_s of the spec): records the client as
    seen, with its phase, round and step, so the operator can tell a slow site from a dead one."""
    del fid  # the client's federation: require_client checked it
    service.enrolment.report_activity(client, body.model_dump())
    return Response(status_code=204)


@router.get("/clients", dependencies=[AdminDep], response_model=list[ClientInfo])
def list_clients(fid: IdPath, service: ServiceDep) -> list[dict[str, Any]]:
    """Every enrolled client with its activity."""
    return service.reads.list_clients(fid)


@router.delete("/clients/{cid}", status_code=204, dependencies=[AdminDep])
def revoke(fid: IdPath, cid: IdPath, service: ServiceDep) -> Response:
    """Revoke a client: its token stops working; it is never selected again."""
    service.enrolment.revoke_client(fid, cid)
    return Response(status_code=204)
