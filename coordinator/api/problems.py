"""RFC 9457 problem+json responses for every error the API returns."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from coordinator.errors import ServiceError

PROBLEM = "application/problem+json"


def problem(status: int, title: str, detail: str, request: Request, **extra: Any) -> JSONResponse:
    """A problem+json response."""
    body = {
        "type": "about:blank",
        "title": title,
        "status": status,
        "detail": detail,
        "instance": request.url.path,
    }
    body.update(extra)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body, status_code=status, media_type=PROBLEM, headers=headers)


def install(app: FastAPI) -> None:
    """Map service errors, validation errors and HTTP errors to problem+json."""

    @app.exception_handler(ServiceError)
    async def _service(request: Request, exc: ServiceError) -> JSONResponse:
        return problem(exc.status, exc.title, exc.detail, request, **exc.extra)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": [str(p) for p in e.get("loc", ())], "msg": e.get("msg", "")} for e in exc.errors()]
        detail = "; ".join(f"{'.'.join(e['loc'])}: {e['msg']}" for e in errors) or "invalid request"
        return problem(422, "Unprocessable content", f"invalid request: {detail}", request, errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        titles = {404: "Not found", 405: "Method not allowed", 401: "Unauthorized", 403: "Forbidden"}
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404 and detail == "Not Found":
            detail = f"no such endpoint: {request.method} {request.url.path}; see /docs"
        return problem(exc.status_code, titles.get(exc.status_code, "Error"), detail, request)
