"""Rounds: open/close/history for the operator; task, update and evaluation for workers."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.to_thread
from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse
from fedprompt.coordinator.api.body import SAFETENSORS_BODY, read_limited_body, upload_ticket
from fedprompt.coordinator.api.deps import (
    AdminDep,
    ClientDep,
    ServiceDep,
    SettingsDep,
    TaskPollDep,
    UploadThreadsDep,
    client_of,
    get_upload_threads,
)
from fedprompt.coordinator.api.fastpath import fast_path, plain_id, plain_json_body, plain_seconds
from fedprompt.coordinator.api.jsonbody import BoundedJSONRoute
from fedprompt.coordinator.api.longpoll import TaskPoll
from fedprompt.coordinator.api.problems import API_ERRORS, problem_responses
from fedprompt.coordinator.api.schemas import (
    EvaluationReport,
    EvaluationStored,
    EvaluationSummary,
    IdPath,
    RoundSummary,
    SiteEvaluations,
    Task,
    UploadReceipt,
)
from fedprompt.coordinator.config import Settings
from fedprompt.coordinator.hosting.paths import FEDERATION, UPDATE
from fedprompt.coordinator.persistence.db import Client
from fedprompt.coordinator.service import Coordinator
from starlette.background import BackgroundTask

router = APIRouter(prefix=FEDERATION, tags=["rounds"], responses=API_ERRORS, route_class=BoundedJSONRoute)

# The workers' routes first: a request is matched against the routes in order, and these take
# nearly every request of a running federation.


MAX_WAIT_S = 300.0  # the most a task poll's `wait` may ask (the coordinator caps it further)


async def _task_response(poll: TaskPoll, fid: int, client: Client, wait: float) -> Response:
    found = await poll.next_task(fid, client, wait)
    if found is None:
        return Response(status_code=204, headers={"Retry-After": "1"})
    return JSONResponse(found)


async def _task_fast(request: Request) -> Response | None:
    """The task poll with plainly valid parameters (fastpath.py)."""
    fid = plain_id(request.path_params["fid"])
    wait = plain_seconds(request, "wait", default=0.0, most=MAX_WAIT_S)
    if fid is None or wait is None:
        return None
    return await _task_response(request.app.state.task_poll, fid, await client_of(request, fid), wait)


@router.get(
    "/task",
    response_model=Task,
    responses={204: {"description": "nothing to do yet; poll again after Retry-After"}},
)
@fast_path(_task_fast)
async def task(
    fid: IdPath,
    client: ClientDep,
    poll: TaskPollDep,
    wait: float = Query(0, ge=0, le=MAX_WAIT_S, description="Long-poll for up to this many seconds."),
) -> Response:
    """The client's next task (evaluate / train / done), long-polling up to `wait` seconds."""
    return await _task_response(poll, fid, client, wait)


async def _report_response(
    service: Coordinator, fid: int, number: int, report: EvaluationReport, client: Client
) -> JSONResponse:
    version = number if report.version is None else report.version
    created = await service.uploads.report_evaluation(fid, version, client, report.model_dump())
    return JSONResponse({"version": version, "stored": created}, status_code=201 if created else 200)


async def _report_fast(request: Request) -> Response | None:
    """The evaluation report with plainly valid parameters and a valid JSON body (fastpath.py)."""
    fid, number = plain_id(request.path_params["fid"]), plain_id(request.path_params["number"])
    if fid is None or number is None or (report := await plain_json_body(request, EvaluationReport)) is None:
        return None
    client = await client_of(request, fid)
    return await _report_response(request.app.state.service, fid, number, report, client)


@router.post(
    "/rounds/{number}/evaluation",
    status_code=201,
    response_model=EvaluationStored,
    responses={200: {"description": "already reported", "model": EvaluationStored}},
)
@fast_path(_report_fast)
async def report_evaluation(
    fid: IdPath, number: IdPath, report: EvaluationReport, client: ClientDep, service: ServiceDep
) -> JSONResponse:
    """Report the evaluation of the prompt produced by round `number` (0: the initial prompt)."""
    return await _report_response(service, fid, number, report, client)


async def _upload_response(
    request: Request,
    service: Coordinator,
    settings: Settings,
    threads: anyio.CapacityLimiter,
    fid: int,
    number: int,
    client: Client,
) -> JSONResponse:
    # held from the first byte until stored: capped per client in number and bytes (429 past either)
    with upload_ticket(request, client.id) as ticket:
        body = await read_limited_body(request, settings.max_upload_bytes, ticket)
        # uploads have threads of their own, see Settings.upload_threads
        result = await anyio.to_thread.run_sync(
            service.uploads.upload, fid, number, client, body, limiter=threads
        )
    # this upload's batch completed the round: aggregate it once the answer is sent
    after = BackgroundTask(service.cycle.after_upload, fid) if result.round_complete else None
    return JSONResponse(
        result.receipt().model_dump(), status_code=201 if result.created else 200, background=after
    )


async def _upload_fast(request: Request) -> Response | None:
    """The upload with plain ids (fastpath.py); the body is read and checked as the route does."""
    fid, number = plain_id(request.path_params["fid"]), plain_id(request.path_params["number"])
    if fid is None or number is None:
        return None
    state = request.app.state
    client = await client_of(request, fid)
    threads = await get_upload_threads(request)
    return await _upload_response(request, state.service, state.settings, threads, fid, number, client)


@router.put(
    UPDATE,
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
@fast_path(_upload_fast)
async def upload(
    fid: IdPath,
    number: IdPath,
    request: Request,
    client: ClientDep,
    service: ServiceDep,
    settings: SettingsDep,
    threads: UploadThreadsDep,
) -> JSONResponse:
    """Upload a trained prompt (safetensors body; metadata carries num_samples and metrics)."""
    return await _upload_response(request, service, settings, threads, fid, number, client)


@router.post(
    "/rounds",
    status_code=201,
    dependencies=[AdminDep],
    response_model=RoundSummary,
    responses=problem_responses(409, e409="a round is open, all rounds are done, or too few clients"),
)
def open_round(fid: IdPath, service: ServiceDep) -> dict[str, Any]:
    """Open the next round now (selects max(ceil(C*K), min_clients) clients)."""
    return service.cycle.open_round(fid)


@router.post(
    "/rounds/{number}/close",
    dependencies=[AdminDep],
    response_model=RoundSummary,
    responses=problem_responses(409, e409="the round is not open, or it is below its quorum"),
)
def close_round(fid: IdPath, number: IdPath, service: ServiceDep) -> dict[str, Any]:
    """Aggregate the open round now with the updates that arrived (needs the quorum)."""
    return service.cycle.close_round(fid, number)


@router.get("/rounds", dependencies=[AdminDep], response_model=list[RoundSummary])
def list_rounds(fid: IdPath, service: ServiceDep) -> list[dict[str, Any]]:
    """Round history: every attempt with participants, timings, bytes and metrics."""
    return service.reads.rounds(fid)


@router.get("/rounds/{number}", dependencies=[AdminDep], response_model=RoundSummary)
def get_round(fid: IdPath, number: IdPath, service: ServiceDep) -> dict[str, Any]:
    """One round (its latest attempt)."""
    return service.reads.round_detail(fid, number)


@router.get("/evaluations/{version}", dependencies=[AdminDep], response_model=EvaluationSummary | None)
def get_evaluation(fid: IdPath, version: IdPath, service: ServiceDep) -> dict[str, Any] | None:
    """Sample-weighted evaluation of a prompt version over the clients that reported (null if none)."""
    return service.reads.evaluations(fid, version)


@router.get("/evaluations/{version}/sites", dependencies=[AdminDep], response_model=SiteEvaluations)
def get_site_evaluations(fid: IdPath, version: IdPath, service: ServiceDep) -> dict[str, Any]:
    """Each site's own evaluation of a prompt version, and how far the sites lie apart (403 under
    secure aggregation unless its spec lets sites report their confusion matrices)."""
    return service.reads.site_evaluations(fid, version)
