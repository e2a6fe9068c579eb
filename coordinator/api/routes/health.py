"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from coordinator.api.deps import ServiceDep, SettingsDep
from coordinator.migrate import schema_is_current

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process is alive."""
    return {"status": "ok"}


@router.get("/readyz")
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
