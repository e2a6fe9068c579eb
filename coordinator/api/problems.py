"""RFC 9457 problem+json responses for every error the API returns."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fedprompt.coordinator.api.links import add_links
from fedprompt.coordinator.errors import ServiceError
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.exc import DBAPIError, OperationalError, ProgrammingError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match

PROBLEM = "application/problem+json"


class Problem(BaseModel):
    """An RFC 9457 problem; some carry extension members (``errors`` of a 422, ``retry_after``)."""

    model_config = ConfigDict(extra="allow")
    type: str = Field(..., examples=["about:blank"])
    title: str
    status: int = Field(..., ge=400, le=599)
    detail: str = Field(..., description="What went wrong and what to do about it.")
    instance: str = Field(..., description="The request's path.")


DESCRIPTIONS = {
    400: "the request body could not be parsed (e.g. it is not UTF-8)",
    401: "no token, or an unknown or expired one",
    403: "the token does not allow this",
    404: "no such federation, round, client or version",
    408: "the request body did not arrive in time (FEDPROMPT_BODY_TIMEOUT_S); the connection is closed",
    409: "conflicts with the federation's current state",
    410: "the round is closed",
    413: "the request body is over the limit",
    422: "the request is not valid",
    429: "too many enrolments or failed authentications from this address; see Retry-After",
    503: "the database is overloaded or unreachable; nothing was changed, retry after Retry-After",
}

# Seconds a client is asked to wait when the database cannot serve the request now.
DB_RETRY_AFTER_S = 2
NO_SCHEMA = (
    "the database has no fedprompt schema (a new or emptied database): run "
    "`fedprompt-coordinator migrate` (`serve` applies the migrations when it starts); nothing was changed"
)


def schema_missing(exc: DBAPIError) -> bool:
    """True when a statement failed because a table does not exist (SQLite's "no such table",
    PostgreSQL's undefined_table, SQLSTATE 42P01)."""
    orig = getattr(exc, "orig", None)
    return getattr(orig, "sqlstate", None) == "42P01" or "no such table" in str(orig)


def _leaf_routes(routes: Iterable[Any]) -> Iterator[Any]:
    """The routes under included routers too (FastAPI wraps each `include_router` in one route)."""
    for route in routes:
        nested = getattr(route, "effective_candidates", None)
        if callable(nested):
            yield from _leaf_routes(nested())
        else:
            yield route


def allowed_methods(request: Request) -> list[str]:
    """Every method some route of this app answers at the request's path (a 405's Allow header)."""
    methods: set[str] = set()
    for route in _leaf_routes(request.app.router.routes):
        match, _ = route.matches(request.scope)
        if match is not Match.NONE and getattr(route, "methods", None):
            methods |= set(route.methods)
    return sorted(methods)


def problem_responses(*codes: int, **descriptions: str) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for error codes: a problem+json body (see `document`).

    ``descriptions`` overrides the generic text per code (keyword ``e409="…"``)."""
    return {
        code: {"model": Problem, "description": descriptions.get(f"e{code}", DESCRIPTIONS[code])}
        for code in codes
    }


# What every route under /api/v1 may answer; routes add 409 / 410 where they can conflict.
API_ERRORS = problem_responses(400, 401, 403, 404, 408, 413, 422, 429, 503)


def document(app: FastAPI) -> None:
    """Make the OpenAPI say what the API sends: every 4xx/5xx body is application/problem+json, and
    which answer feeds which operation (links.py)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()
            for operation in (op for ops in schema.get("paths", {}).values() for op in ops.values()):
                for response in operation.get("responses", {}).values():
                    content = response.get("content", {})
                    schema_ref = content.get("application/json", {}).get("schema", {}).get("$ref", "")
                    if schema_ref.endswith("/Problem"):
                        content[PROBLEM] = content.pop("application/json")
            app.openapi_schema = add_links(schema)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to extend the schema


def problem(
    status: int,
    title: str,
    detail: str,
    request: Request,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    """A problem+json response."""
    body = {
        "type": "about:blank",
        "title": title,
        "status": status,
        "detail": detail,
        "instance": request.url.path,
    }
    body.update(extra)
    headers = dict(headers or {})
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(body, status_code=status, media_type=PROBLEM, headers=headers)


def install(app: FastAPI) -> None:
    """Map service errors, validation errors and HTTP errors to problem+json."""
    document(app)

    @app.exception_handler(ServiceError)
    async def _service(request: Request, exc: ServiceError) -> JSONResponse:
        headers = getattr(exc, "headers", None)  # e.g. Retry-After of a 429
        return problem(exc.status, exc.title, exc.detail, request, headers, **exc.extra)

    @app.exception_handler(PoolTimeout)
    @app.exception_handler(OperationalError)
    @app.exception_handler(ProgrammingError)
    async def _database_busy(request: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, DBAPIError) and schema_missing(exc):
            return problem(
                503, "Service unavailable", NO_SCHEMA, request, {"Retry-After": "30"}, retry_after=30
            )
        if isinstance(exc, ProgrammingError):
            raise exc  # a defect, not a state of the database: the server error it is
        # Pool exhausted, SQLite busy past its timeout, Postgres unreachable: the transaction was
        # rolled back, so the request can be repeated as it is.
        reason = (
            "no database connection was free in time" if isinstance(exc, PoolTimeout) else "database error"
        )
        return problem(
            503,
            "Service unavailable",
            f"{reason}; nothing was changed: retry in {DB_RETRY_AFTER_S} s",
            request,
            {"Retry-After": str(DB_RETRY_AFTER_S)},
            retry_after=DB_RETRY_AFTER_S,
        )

    @app.exception_handler(ClientDisconnect)
    async def _disconnected(request: Request, exc: ClientDisconnect) -> JSONResponse:
        # the client went away in the middle of its body: nobody reads this answer, but the request
        # ends as a 4xx like any refused input, not as an error trace
        return problem(
            400,
            "Bad request",
            "the client disconnected before its request body arrived",
            request,
            {"Connection": "close"},
        )

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": [str(p) for p in e.get("loc", ())], "msg": e.get("msg", "")} for e in exc.errors()]
        detail = "; ".join(f"{'.'.join(e['loc'])}: {e['msg']}" for e in errors) or "invalid request"
        return problem(422, "Unprocessable content", f"invalid request: {detail}", request, errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        titles = {
            400: "Bad request",
            401: "Unauthorized",
            403: "Forbidden",
            404: "Not found",
            405: "Method not allowed",
            408: "Request timeout",
            413: "Payload too large",
            429: "Too many requests",
            431: "Request header fields too large",
        }
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404 and detail == "Not Found":
            detail = f"no such endpoint: {request.method} {request.url.path}; see /docs"
        if exc.status_code == 400 and detail == "There was an error parsing the body":  # FastAPI's words
            detail = (
                "the request body could not be parsed: send UTF-8 JSON with Content-Type: application/json"
            )
        # its headers too: Allow of a 405, Connection: close of a 408
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:  # Starlette names the first route's methods; the path may have more
            allow = allowed_methods(request)
            headers["Allow"] = ", ".join(allow)
            detail = f"{request.method} is not allowed on {request.url.path}; allowed: {', '.join(allow)}"
        return problem(exc.status_code, titles.get(exc.status_code, "Error"), detail, request, headers)
