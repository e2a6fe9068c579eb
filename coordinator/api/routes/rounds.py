"""Rounds: open/close/history for the operator; task, update and evaluation for workers."""

from __future__ import annotations

import time
from typing import Any

import anyio.to_thread
from fastapi import APIRouter, BackgroundTasks, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from coordinator.api.deps import (
    SAFETENSORS_BODY,
    AdminDep,
    ClientDep,
    IdPath,
    ServiceDep,
    SettingsDep,
    read_limited_body,
    upload_ticket,
)
from coordinator.api.jsonbody import BoundedJSONRoute
from coordinator.api.longpoll import StampWatch
from coordinator.api.problems import API_ERRORS, problem_responses
from coordinator.api.schemas import EvaluationStored, EvaluationSummary, RoundSummary, Task, UploadReceipt
from coordinator.db import MAX_ID

router = APIRouter(
    prefix="/api/v1/federations/{fid}", tags=["rounds"], responses=API_ERRORS, route_class=BoundedJSONRoute
)


@router.post(
    "/rounds",
    status_code=201,
    dependencies=[AdminDep],
    response_model=RoundSummary,
    responses=problem_responses(409, e409="a round is open, all rounds are done, or too few clients"),
)
def open_round(fid: IdPath, service: ServiceDep) -> dict[str, Any]:
    """Open the next round now (selects max(ceil(C*K), min_clients) clients)."""
    return service.open_round(fid)


@router.post(
    "/rounds/{number}/close",
    dependencies=[AdminDep],
    response_model=RoundSummary,
    responses=problem_responses(409, e409="the round is not open, or it is below its quorum"),
)
def close_round(fid: IdPath, number: IdPath, service: ServiceDep) -> dict[str, Any]:
    """Aggregate the open round now with the updates that arrived (needs the quorum)."""
    return service.close_round(fid, number)


@router.get("/rounds", dependencies=[AdminDep], response_model=list[RoundSummary])
def list_rounds(fid: IdPath, service: ServiceDep) -> list[dict[str, Any]]:
    """Round history: every attempt with participants, timings, bytes and metrics."""
    return service.rounds(fid)


@router.get("/rounds/{number}", dependencies=[AdminDep], response_model=RoundSummary)
def get_round(fid: IdPath, number: IdPath, service: ServiceDep) -> dict[str, Any]:
    """One round (its latest attempt)."""
    return service.round_detail(fid, number)


@router.get("/evaluations/{version}", dependencies=[AdminDep], response_model=EvaluationSummary | None)
def get_evaluation(fid: IdPath, version: IdPath, service: ServiceDep) -> dict[str, Any] | None:
    """Sample-weighted evaluation of a prompt version over the clients that reported (null if none)."""
    return service.evaluations(fid, version)


@router.get(
    "/task",
    response_model=Task,
    responses={204: {"description": "nothing to do yet; poll again after Retry-After"}},
)
async def task(
    request: Request,
    fid: IdPath,
    client: ClientDep,
    service: ServiceDep,
    settings: SettingsDep,
    wait: float = Query(0, ge=0, le=300, description="Long-poll for up to this many seconds."),
) -> Response:
    """The client's next task (evaluate / train / done), long-polling up to `wait` seconds."""
    deadline = time.monotonic() + min(wait, settings.long_poll_max_s)
    if service.heartbeat_due(client):
        await run_in_threadpool(service.heartbeat, client)
    # the app's watch lives on its event loop (made by the lifespan); without one, a watch of its own
    watch = getattr(request.app.state, "stamp_watch", None) or StampWatch(
        service, settings.long_poll_interval_s
    )
    seen = None
    while True:
        stamp = await watch.stamp(fid)
        if stamp != seen:  # only a change of the federation can bring this client a new task
            found = await run_in_threadpool(service.next_task, fid, client)
            if found is not None:
                return JSONResponse(found)
            seen = stamp
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return Response(status_code=204, headers={"Retry-After": "1"})
        await watch.wait_change(fid, seen, remaining)


@router.put(
    "/rounds/{number}/update",
    responses={
        200: {"description": "identical re-upload", "model": UploadReceipt},
        201: {"description": "accepted and committed"},
        **problem_responses(
            403,
            409,
            410,
            413,
            422,
            e403="not selected for this round (or the token does not allow this)",
            e409="a different update was already accepted",
            e410="round closed",
            e413="over FEDPROMPT_MAX_UPLOAD_BYTES",
            e422="not a valid prompt for this federation",
        ),
    },
    status_code=201,
    response_model=UploadReceipt,
    openapi_extra=SAFETENSORS_BODY,
)
async def upload(
    fid: IdPath,
    number: IdPath,
    request: Request,
    client: ClientDep,
    service: ServiceDep,
    settings: SettingsDep,
    background: BackgroundTasks,
) -> JSONResponse:
    """Upload a trained prompt (safetensors body; metadata carries num_samples and metrics)."""
    # held from the first byte until stored: capped per client in number and bytes (429 past either)
    with upload_ticket(request, client.id) as ticket:
        body = await read_limited_body(request, settings.max_upload_bytes, ticket)
        # uploads have threads of their own (set up with the app's lifespan), see Settings.upload_threads
        limiter = getattr(request.app.state, "upload_limiter", None)
        result = await anyio.to_thread.run_sync(service.upload, fid, number, client, body, limiter=limiter)
    if result.round_complete:  # this upload's batch completed the round: aggregate it now
        background.add_task(service.after_upload, fid)
    payload = {
        "round": result.round,
        "attempt": result.attempt,
        "client_id": result.client_id,
        "sha256": result.sha256,
        "num_samples": result.num_samples,
        "size": result.size,
    }
    return JSONResponse(payload, status_code=201 if result.created else 200)


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


@router.post(
    "/rounds/{number}/evaluation",
    status_code=201,
    response_model=EvaluationStored,
    responses={200: {"description": "already reported", "model": EvaluationStored}},
)
def report_evaluation(
    fid: IdPath, number: IdPath, report: EvaluationReport, client: ClientDep, service: ServiceDep
) -> JSONResponse:
    """Report the evaluation of the prompt produced by round `number` (0: the initial prompt)."""
    version = number if report.version is None else report.version
    created = service.report_evaluation(fid, version, client, report.model_dump())
    return JSONResponse({"version": version, "stored": created}, status_code=201 if created else 200)
