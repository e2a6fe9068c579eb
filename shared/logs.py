"""Structured logs (structlog): JSON lines for machines, a readable console format for people.

``configure_logging`` routes the standard library's logging (uvicorn, SQLAlchemy, the service's
own ``logging.getLogger`` calls) through structlog's formatter, so every line has the same shape
and carries the context bound to the request: ``request_id`` and, where the route has them,
``federation_id``, ``round`` and ``client_id``. Used by the coordinator and the worker.
"""

from __future__ import annotations

import logging
import re
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Annotated, Any, Literal, TextIO

import structlog
import typer
from fastapi import Request

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

LogFormat = Literal["auto", "json", "console"]
# The --log-format option both services' CLIs share.
LogFormatOption = Annotated[
    str,
    typer.Option(
        envvar="FEDPROMPT_LOG_FORMAT",
        help="auto (console on a terminal, JSON lines otherwise) | json | console.",
    ),
]

REQUEST_ID_HEADER = "x-request-id"
_VALID_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
# Path parameters as they are named in routes → the log field they become.
PATH_FIELDS = {"fid": "federation_id", "number": "round", "cid": "client_id"}
QUIET_ROUTES = frozenset({"/healthz", "/readyz", "/metrics"})

access_log = logging.getLogger("fedprompt.access")


def resolve_format(fmt: str, stream: TextIO) -> Literal["json", "console"]:
    """'auto' means console on a terminal and JSON lines otherwise."""
    if fmt not in ("auto", "json", "console"):
        raise ValueError(f"log format must be auto, json or console, not {fmt!r}")
    if fmt == "auto":
        isatty = getattr(stream, "isatty", None)
        return "console" if callable(isatty) and isatty() else "json"
    return fmt  # type: ignore[return-value]


def configure_logging(
    level: str | int = "info",
    fmt: str = "auto",
    *,
    stream: TextIO | None = None,
    static: dict[str, Any] | None = None,
) -> Literal["json", "console"]:
    """Configure structlog and the root logger once per process; returns the format chosen."""
    stream = stream or sys.stderr
    chosen = resolve_format(fmt, stream)
    level_no = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    if not isinstance(level_no, int):
        raise ValueError(f"unknown log level {level!r}")
    fixed = dict(static or {})

    def add_static(_logger: Any, _name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
        for key, value in fixed.items():
            event_dict.setdefault(key, value)
        return event_dict

    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        add_static,
    ]
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *shared,
            structlog.stdlib.PositionalArgumentsFormatter(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    if chosen == "json":
        render: list[Any] = [
            structlog.processors.dict_tracebacks,
            structlog.processors.JSONRenderer(sort_keys=False, default=str),
        ]
    else:
        render = [structlog.dev.ConsoleRenderer(colors=_colors(stream))]
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.ExtraAdder()],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, tidy, *render],
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level_no)
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(max(level_no, logging.WARNING))
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers.clear()
        lg.propagate = True
    return chosen


FIRST_KEYS = ("timestamp", "level", "logger", "event")
DROPPED_KEYS = ("color_message",)  # uvicorn's ANSI-coloured duplicate of the message


def tidy(_logger: Any, _name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """Put timestamp, level, logger and event first; drop uvicorn's coloured duplicate."""
    for key in DROPPED_KEYS:
        event_dict.pop(key, None)
    head = {k: event_dict.pop(k) for k in FIRST_KEYS if k in event_dict}
    return {**head, **event_dict}


def _colors(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(callable(isatty) and isatty())


def request_id_from(value: str | None) -> str:
    """The caller's X-Request-ID when it is a sane token, else a fresh one."""
    if value and _VALID_REQUEST_ID.match(value):
        return value
    return uuid.uuid4().hex


def path_fields(path_params: dict[str, Any]) -> dict[str, Any]:
    """Log fields (federation_id, round, client_id) from a route's path parameters."""
    out: dict[str, Any] = {}
    for param, field in PATH_FIELDS.items():
        if param in path_params:
            value = path_params[param]
            out[field] = int(value) if isinstance(value, str) and value.isdigit() else value
    return out


async def bind_route_context(request: Request) -> None:
    """App-wide dependency: bind the route's federation/round/client ids into the log context."""
    # async on purpose: it runs in the request's task, so the binding reaches the endpoint's thread
    fields = path_fields(request.path_params)
    if fields:
        structlog.contextvars.bind_contextvars(**fields)


class RequestContextMiddleware:
    """Pure ASGI middleware: X-Request-ID in/out, a fresh log context, one access line per request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve the request inside its own log context."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        raw = headers.get(REQUEST_ID_HEADER.encode())
        request_id = request_id_from(raw.decode("latin-1") if raw else None)
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(request_id=request_id)
        start = time.perf_counter()
        status: dict[str, Any] = {"code": 500, "end": None}

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = int(message["status"])
                message.setdefault("headers", [])
                message["headers"] = [
                    (k, v) for k, v in message["headers"] if k.lower() != REQUEST_ID_HEADER.encode()
                ] + [(REQUEST_ID_HEADER.encode(), request_id.encode())]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                status["end"] = time.perf_counter()  # background tasks run after the response

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            route = getattr(scope.get("route"), "path", None) or "<unmatched>"
            fields: dict[str, Any] = {
                "request_id": request_id,
                "method": scope.get("method"),
                "path": scope.get("path"),
                "route": route,
                "status": status["code"],
                "duration_ms": round(((status["end"] or time.perf_counter()) - start) * 1000, 2),
                **path_fields(scope.get("path_params") or {}),
            }
            client_id = (scope.get("state") or {}).get("client_id")
            if client_id is not None:
                fields["client_id"] = client_id
            level = logging.DEBUG if route in QUIET_ROUTES else logging.INFO
            access_log.log(level, "request", extra=fields)
            structlog.contextvars.clear_contextvars()
