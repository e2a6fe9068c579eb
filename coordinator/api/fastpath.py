"""The requests a running federation is mostly made of, answered without FastAPI's per-request
dependency solving when their ids and body are plainly valid.

At K = 1,000 clients, C = 1 and two rounds a federation is about 15,000 requests: 6,000 task polls,
3,000 prompt downloads, 3,000 evaluation reports, 2,000 uploads and 1,000 enrolments. A py-spy
profile of the coordinator under that load (bench/results/profiles/before/, commit 9147a43) put
FastAPI's `solve_dependencies` at about a fifth of its samples: for each request FastAPI solves the
route's dependency tree anew and validates every parameter through pydantic. A route marked with
`fast_path(fn)` first offers its request to `fn`, which reads the path and query parameters (and a
JSON body) itself and returns a response, or None when any of them is anything but the plain form;
then FastAPI's own handler validates the request and answers as always. The route stays the
documented one (OpenAPI, matching, middleware and exception handlers are unchanged); the fast path
calls the same authorisation (`client_of`, `admin_or_client_of`: `authorize_client`) and the same
code after it as the route's endpoint, so what a caller may do and every refusal are the same either
way (tests/coordinator/test_fastpath.py sends the same requests both ways).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import HTTPException, Request, Response
from fedprompt.coordinator.api.schemas import is_id_text
from fedprompt.coordinator.persistence.db import MAX_ID
from pydantic import BaseModel, ValidationError

FastPath = Callable[[Request], Awaitable[Response | None]]
Endpoint = TypeVar("Endpoint", bound=Callable[..., object])
Model = TypeVar("Model", bound=BaseModel)

FAST_PATH_ATTRIBUTE = "__fast_path__"
# A long-poll wait as a worker writes it: up to three digits and an optional fraction (the route's
# Query takes 0 to 300; anything else, 1e2 included, goes to FastAPI's validation).
_PLAIN_SECONDS = re.compile(r"[0-9]{1,3}(?:\.[0-9]{1,6})?")


def fast_path(fn: FastPath) -> Callable[[Endpoint], Endpoint]:
    """Mark a route's endpoint: its requests are offered to `fn` first (BoundedJSONRoute)."""

    def mark(endpoint: Endpoint) -> Endpoint:
        setattr(endpoint, FAST_PATH_ATTRIBUTE, fn)
        return endpoint

    return mark


def fast_path_of(endpoint: Callable[..., object]) -> FastPath | None:
    """The fast path a route's endpoint was marked with, if any."""
    return getattr(endpoint, FAST_PATH_ATTRIBUTE, None)


def plain_id(text: str) -> int | None:
    """A path id in the form IdPath takes (schemas.is_id_text, at most MAX_ID), else None."""
    if not is_id_text(text):
        return None
    value = int(text)
    return value if value <= MAX_ID else None


def plain_seconds(request: Request, name: str, *, default: float, most: float) -> float | None:
    """A query parameter of seconds in its plain form within [0, most]; `default` when the query has
    none; None for anything else (two values, a sign, an exponent, more than `most`)."""
    values = request.query_params.getlist(name)
    if not values:
        return default
    if len(values) > 1 or not _PLAIN_SECONDS.fullmatch(values[0]):
        return None
    value = float(values[0])
    return value if value <= most else None


async def plain_json_body(request: Request, model: type[Model]) -> Model | None:
    """The request's body as `model` when it is sent as application/json and is valid, else None.

    FastAPI reads the body before it solves any dependency and answers a body it cannot read or
    validate itself; None leaves that to it (the body read here is kept on the request, so FastAPI's
    handler reads the same bytes). An HTTPException while reading or parsing (the body middleware's
    413 and 429, jsonlimits' 400) is raised as FastAPI's handler raises it, before any dependency."""
    if request.headers.get("content-type") != "application/json":
        return None
    try:
        payload: Any = await request.json()
    except HTTPException:
        raise
    except Exception:  # not JSON, or the client went: FastAPI's handler answers it as always
        return None
    try:
        return model.model_validate(payload)
    except ValidationError:
        return None
