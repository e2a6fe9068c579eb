"""Secure aggregation's stages for workers: public keys, share envelopes and revealed shares of the
open round (the masked vector goes up through the update route)."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Body
from fastapi.responses import JSONResponse
from fedprompt.coordinator.api.deps import ClientDep, ServiceDep
from fedprompt.coordinator.api.jsonbody import BoundedJSONRoute
from fedprompt.coordinator.api.problems import API_ERRORS, problem_responses
from fedprompt.coordinator.api.schemas import IdPath, SecaggStored
from fedprompt.coordinator.hosting.paths import FEDERATION

router = APIRouter(
    prefix=FEDERATION, tags=["secure aggregation"], responses=API_ERRORS, route_class=BoundedJSONRoute
)


@router.post(
    "/rounds/{number}/secagg/{stage}",
    status_code=201,
    response_model=SecaggStored,
    responses={
        200: {"description": "identical repeat", "model": SecaggStored},
        **problem_responses(
            403,
            404,
            409,
            410,
            422,
            e403="not selected for this round",
            e404="the federation does not use secure aggregation",
            e409="not this client's stage now, different from what it already sent, or another signing key",
            e410="round not open",
            e422="malformed or unsigned keys, envelopes, signatures or shares",
        ),
    },
)
def post_stage(
    fid: IdPath,
    number: IdPath,
    stage: Literal["keys", "shares", "consistency", "unmask"],
    client: ClientDep,
    service: ServiceDep,
    payload: dict[str, Any] = Body(...),
) -> JSONResponse:
    """A secure round's stage answer: `keys` {encryption_key, mask_key, seed_commitment, signing_key,
    signature} (base64 X25519 public keys, hex sha256 of the self-mask seed, the client's Ed25519 key,
    pinned to it the first time, and its signature of the round's keys); `shares` {envelopes: {number:
    base64}}, one AES-GCM envelope per neighbour the task named; `consistency` {signature}, the client's
    signature of the survivor set; `unmask` {shares: {number: {kind: seed|key, share: base64}}}."""
    answer = service.cycle.secure_stage(fid, number, client, stage, payload)
    return JSONResponse(answer, status_code=201 if answer["stored"] else 200)
