"""Federations: create, list, status, pause/resume, prompts, events."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from fedprompt.coordinator.api.body import SAFETENSORS_BODY, read_limited_body, upload_ticket
from fedprompt.coordinator.api.deps import AdminDep, EitherDep, ServiceDep, SettingsDep, admin_or_client_of
from fedprompt.coordinator.api.fastpath import fast_path, plain_id
from fedprompt.coordinator.api.jsonbody import BoundedJSONRoute
from fedprompt.coordinator.api.problems import API_ERRORS, problem_responses
from fedprompt.coordinator.api.schemas import (
    Event,
    FederationStatus,
    IdPath,
    InitialPrompt,
    SpecBody,
    VersionPath,
)
from fedprompt.coordinator.hosting.paths import FEDERATIONS, INITIAL_PROMPT
from fedprompt.coordinator.persistence.db import MAX_ID, Client
from fedprompt.coordinator.service import Coordinator

router = APIRouter(
    prefix=FEDERATIONS, tags=["federations"], responses=API_ERRORS, route_class=BoundedJSONRoute
)

# The prompt download first: a request is matched against the routes in order, and every worker
# fetches each new version.


async def _prompt_response(
    request: Request, service: Coordinator, fid: int, version: str, who: Client | None
) -> Response:
    # a version held in memory is answered here; one that needs the database, in a thread
    pv = service.tasks.cached_prompt(fid, version, client=who)
    if pv is None:
        pv = await run_in_threadpool(service.tasks.get_prompt, fid, version, client=who)
    etag = f'"{pv.sha256}"'
    headers = {"ETag": etag, "X-Prompt-Version": str(pv.version), "X-Prompt-Sha256": pv.sha256}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    return Response(pv.blob, media_type="application/octet-stream", headers=headers)


async def _prompt_fast(request: Request) -> Response | None:
    """The prompt download with plainly valid parameters (fastpath.py)."""
    fid = plain_id(request.path_params["fid"])
    version = request.path_params["version"]
    if fid is None or not (version in ("latest", "best") or plain_id(version) is not None):
        return None
    who = await admin_or_client_of(request, fid)
    return await _prompt_response(request, request.app.state.service, fid, version, who)


@router.get(
    "/{fid}/prompts/{version}",
    response_class=Response,
    responses={
        200: {"content": {"application/octet-stream": {}}, "description": "safetensors bytes"},
        304: {"description": "the version named by If-None-Match is current (no body)"},
    },
)
@fast_path(_prompt_fast)
async def get_prompt(
    fid: IdPath, version: VersionPath, service: ServiceDep, who: EitherDep, request: Request
) -> Response:
    """A global prompt version ('latest' or a number) as safetensors; ETag is its sha256."""
    return await _prompt_response(request, service, fid, version, who)


@router.post("", status_code=201, dependencies=[AdminDep], response_model=FederationStatus)
def create_federation(service: ServiceDep, spec: SpecBody) -> dict[str, Any]:
    """Create a federation from a spec (JSON); an absent deadline takes the server's default."""
    fed = service.federations.create_federation(spec)
    return service.reads.federation_status(fed.id)


@router.get("", dependencies=[AdminDep], response_model=list[FederationStatus])
def list_federations(service: ServiceDep) -> list[dict[str, Any]]:
    """Every federation with its status."""
    return service.reads.list_federations()


@router.get("/{fid}", dependencies=[AdminDep], response_model=FederationStatus)
def federation_status(fid: IdPath, service: ServiceDep) -> dict[str, Any]:
    """State, current round, clients and latest metrics."""
    return service.reads.federation_status(fid)


@router.post(
    "/{fid}/pause",
    dependencies=[AdminDep],
    response_model=FederationStatus,
    responses=problem_responses(409),
)
def pause(fid: IdPath, service: ServiceDep) -> dict[str, Any]:
    """Stop opening rounds automatically (the open round still finishes)."""
    return service.federations.set_paused(fid, True)


@router.post(
    "/{fid}/resume",
    dependencies=[AdminDep],
    response_model=FederationStatus,
    responses=problem_responses(409),
)
def resume(fid: IdPath, service: ServiceDep) -> dict[str, Any]:
    """Open rounds automatically again."""
    return service.federations.set_paused(fid, False)


@router.get("/{fid}/events", dependencies=[AdminDep], response_model=list[Event])
def events(
    fid: IdPath, service: ServiceDep, after: int = Query(0, ge=0, le=MAX_ID), limit: int = 200
) -> list[dict[str, Any]]:
    """The federation's audit trail (round opened/closed/failed, enrolments, revocations)."""
    return service.reads.events(fid, after=after, limit=min(max(limit, 1), 1000))


@router.get("/{fid}/spec")
def get_spec(fid: IdPath, service: ServiceDep, who: EitherDep) -> dict[str, Any]:
    """The federation's spec (workers read it to load the right model, template and verbalizer)."""
    del who  # authentication only: admin or a client of this federation
    return service.federations.federation_spec(fid)


@router.get(
    "/{fid}/prompts/{version}/control",
    response_class=Response,
    responses={
        200: {"content": {"application/octet-stream": {}}, "description": "safetensors bytes"},
        **problem_responses(404, 410, e404="no such version, or the federation does not use SCAFFOLD"),
    },
)
def get_control(fid: IdPath, version: VersionPath, service: ServiceDep, who: EitherDep) -> Response:
    """SCAFFOLD's server control variate after a prompt version (float32 safetensors, zeros after
    version 0; only the latest version's is kept). Training clients fetch it with the base prompt."""
    return Response(
        service.tasks.get_control(fid, version, client=who), media_type="application/octet-stream"
    )


@router.put(
    "/{fid}" + INITIAL_PROMPT,
    dependencies=[AdminDep],
    status_code=200,
    response_model=InitialPrompt,
    responses=problem_responses(409, e409="round 1 has already opened"),
    openapi_extra=SAFETENSORS_BODY,
)
async def set_initial_prompt(
    fid: IdPath, request: Request, service: ServiceDep, settings: SettingsDep
) -> JSONResponse:
    """Replace the initial prompt (version 0) before round 1, e.g. with a vocabulary initialisation."""
    with upload_ticket(request, "admin") as ticket:
        body = await read_limited_body(request, settings.max_upload_bytes, ticket)
        pv = service.federations.set_initial_prompt(fid, body)
    return JSONResponse({"version": 0, "sha256": pv.sha256})
