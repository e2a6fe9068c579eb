"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from fedprompt.coordinator.api.deps import MetricsDep, ServiceDep, SettingsDep
from fedprompt.coordinator.api.jsonbody import BoundedJSONRoute
from fedprompt.coordinator.api.schemas import Health
from fedprompt.coordinator.persistence.migrate import schema_is_current

router = APIRouter(tags=["health"], route_class=BoundedJSONRoute)


@router.get("/healthz", response_model=Health)
async def healthz() -> dict[str, str]:
    """The process is alive (answered on the event loop, past the connection limit: server.py)."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    response_model=Health,
    responses={503: {"model": Health, "description": "the database is unreachable or behind"}},
)
def readyz(service: ServiceDep, settings: SettingsDep) -> JSONResponse:
    """The database answers and its schema is at the migrations' head."""
    try:
        current = schema_is_current(service.sessions.kw["bind"])
    except Exception as exc:  # any DB failure means not ready
        return JSONResponse({"status": "unavailable", "detail": f"database: {exc}"}, status_code=503)
    if not current:
        return JSONResponse(
            {"status": "unavailable", "detail": "schema is not at head; run `fedprompt-coordinator migrate`"},
            status_code=503,
        )
    return JSONResponse({"status": "ready"})


@router.get("/metrics", response_class=Response)
async def metrics(registry: MetricsDep) -> Response:
    """Prometheus metrics: counters of this process, gauges read from the database."""
    body, content_type = await run_in_threadpool(registry.render)  # the gauges query the DB
    return Response(body, media_type=content_type)
