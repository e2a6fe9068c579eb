"""Structured logs (structlog): JSON lines for machines, a readable console format for people.

``configure_logging`` routes the standard library's logging (uvicorn, SQLAlchemy, the service's
own ``logging.getLogger`` calls) through structlog's formatter, so every line has the same shape
and carries the context bound to the request: ``request_id`` and, where the route has them,
``federation_id``, ``round`` and ``client_id``. Used by the coordinator and the worker.

What never reaches a line (``redact``, the last processor before rendering): the value of any field
named like a header, a cookie, a token, a password, a secret or a body; any token-shaped string
(``fpe_…``, ``fpc_…``, ``Bearer …``) and any secret registered with ``register_secret`` (the admin
token), wherever it appears, exception messages included. Error traces carry no frame locals and
at most ``TRACE_FRAMES`` frames; strings are cut at ``MAX_FIELD_CHARS`` and a line that is still
over ``MAX_EVENT_CHARS`` keeps only its head. The same warning or error (same logger, message,
exception type and place) is written at most once per ``REPEAT_WINDOW_S``; the next one that is
written says how many were left out (``repeats_suppressed``).
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Annotated, Any, Literal, TextIO

import structlog
import typer
from structlog.typing import EventDict, WrappedLogger

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
_REQUEST_ID_KEY = REQUEST_ID_HEADER.encode()
# A caller's request id is kept only when it cannot be a credential: a UUID (with or without dashes)
# or a short label of at most 20 characters. Every token and session id this project issues is longer
# (22+ random characters), so a cookie or bearer token pasted into X-Request-ID is never logged.
_VALID_REQUEST_ID = re.compile(
    r"^(?:[0-9a-fA-F]{32}|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
    r"|[A-Za-z0-9._:-]{1,20})$"
)
# Path parameters as they are named in routes → the log field they become.
PATH_FIELDS = {"fid": "federation_id", "number": "round", "cid": "client_id"}
QUIET_ROUTES = frozenset({"/healthz", "/readyz", "/metrics"})

access_log = logging.getLogger("fedprompt.access")

REDACTED = "[redacted]"
# Fields whose value is never written, by name (lower case, '-' read as '_'), and name endings.
SECRET_FIELDS = frozenset(
    {
        "authorization",
        "proxy_authorization",
        "cookie",
        "cookies",
        "set_cookie",
        "headers",
        "token",
        "password",
        "passwd",
        "secret",
        "credentials",
        "api_key",
        "body",
        "content",
        "form",
    }
)
SECRET_SUFFIXES = ("_token", "_password", "_secret", "_body", "_cookie", "_authorization", "_api_key")
# Token-shaped strings: this project's enrolment and client tokens (fpe_, fpc_ and any fpX_ prefix),
# and whatever follows "Bearer" or "Basic"; the admin token is any string, so it is registered.
TOKEN_SHAPED = re.compile(r"\bfp[a-z]_[A-Za-z0-9_-]{6,}")
AUTH_SCHEME = re.compile(r"(?i)\b(bearer|basic)(\s+|%20|\+)[^\s\"',;]+")
MAX_FIELD_CHARS = 2000
MAX_ITEMS = 50
MAX_DEPTH = 6
MAX_EVENT_CHARS = 16_000
TRACE_FRAMES = 12
REPEAT_WINDOW_S = 60.0
_secrets: set[str] = set()


def register_secret(value: str | None) -> None:
    """A secret that is never written, wherever it appears (the admin token: it has no shape)."""
    if value and len(value) >= 8:
        _secrets.add(value)


def _secret_field(key: Any) -> bool:
    name = str(key).lower().replace("-", "_")
    return name in SECRET_FIELDS or name.endswith(SECRET_SUFFIXES)


def redact_text(text: str) -> str:
    """A string with every token-shaped substring and registered secret replaced, cut to size."""
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    text = TOKEN_SHAPED.sub(REDACTED, text)
    text = AUTH_SCHEME.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    if len(text) > MAX_FIELD_CHARS:
        text = f"{text[:MAX_FIELD_CHARS]}… [{len(text) - MAX_FIELD_CHARS} more characters]"
    return text


def redact_value(value: Any, depth: int = 0) -> Any:
    """A field's value with secrets removed and its size bounded (strings, containers, depth)."""
    if isinstance(value, str):
        return redact_text(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return f"[{len(value)} bytes]"  # never the bytes: a body, a blob
    if depth >= MAX_DEPTH:
        return "[nested too deep]"
    if isinstance(value, dict):
        return _redact_fields(value, depth)
    if isinstance(value, list | tuple | set | frozenset):
        items = list(value)
        kept = [redact_value(v, depth + 1) for v in items[:MAX_ITEMS]]
        if len(items) > MAX_ITEMS:
            kept.append(f"… {len(items) - MAX_ITEMS} more items")
        return kept
    return redact_text(str(value))


def _redact_fields(fields: Mapping[Any, Any], depth: int) -> dict[str, Any]:
    """A mapping's first MAX_ITEMS fields under redacted keys, each value redacted (a secret field's
    value replaced)."""
    out: dict[str, Any] = {}
    for i, (k, v) in enumerate(fields.items()):
        if i >= MAX_ITEMS:
            out["…"] = f"{len(fields) - MAX_ITEMS} more fields"
            break
        key = redact_text(str(k))
        out[key] = REDACTED if _secret_field(k) and v not in (None, "") else redact_value(v, depth + 1)
    return out


def redact(_logger: WrappedLogger, _name: str, event_dict: EventDict) -> dict[str, Any]:
    """structlog processor: no secret and nothing unbounded in any field (see the module's docstring)."""
    out = _redact_fields(event_dict, 0)
    if len(json.dumps(out, default=str)) > MAX_EVENT_CHARS:  # still too large: keep its head
        head = {k: out[k] for k in (*FIRST_KEYS, "request_id", "exc_type") if k in out}
        exc = out.get("exception")
        if isinstance(exc, list) and exc and isinstance(exc[-1], dict):
            head["exc_type"] = exc[-1].get("exc_type")
            head["exc_value"] = str(exc[-1].get("exc_value", ""))[:MAX_FIELD_CHARS]
        elif isinstance(exc, str):
            head["exception"] = exc[-MAX_FIELD_CHARS:]
        head["truncated"] = f"the line was over {MAX_EVENT_CHARS} characters; fields dropped"
        return head
    return out


class RepeatLimiter:
    """At most `burst` records of one kind per `window_s` seconds; the rest are counted (pure logic)."""

    def __init__(
        self,
        window_s: float = REPEAT_WINDOW_S,
        burst: int = 1,
        *,
        max_kinds: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window_s, self.burst, self.max_kinds, self.clock = window_s, burst, max_kinds, clock
        self._kinds: OrderedDict[Any, list[float | int]] = OrderedDict()  # kind -> [start, seen, dropped]
        self._lock = threading.Lock()

    def admit(self, kind: Any) -> tuple[bool, int]:
        """(write it?, how many of this kind were left out before it when it is written)."""
        now = self.clock()
        with self._lock:
            entry = self._kinds.get(kind)
            if entry is None or now - entry[0] >= self.window_s:
                dropped = int(entry[2]) if entry is not None else 0
                self._kinds[kind] = [now, 1, 0]
                self._kinds.move_to_end(kind)
                while len(self._kinds) > self.max_kinds:
                    self._kinds.popitem(last=False)
                return True, dropped
            entry[1] += 1
            if entry[1] <= self.burst:
                return True, 0
            entry[2] += 1
            return False, 0


class RepeatFilter(logging.Filter):
    """A logging filter: the same warning or error is written at most once per window (RepeatLimiter)."""

    def __init__(self, limiter: RepeatLimiter | None = None, level: int = logging.WARNING) -> None:
        super().__init__()
        self.limiter = limiter or RepeatLimiter()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < self.level:
            return True
        admitted, dropped = self.limiter.admit(_kind(record))
        if admitted and dropped:
            if isinstance(record.msg, dict):
                record.msg["repeats_suppressed"] = dropped
            else:
                record.repeats_suppressed = dropped
        return admitted


# Fields that differ between repeats of the same event: left out of what makes two records alike.
_VOLATILE = frozenset(
    {"timestamp", "request_id", "duration_ms", "exc_info", "exception", "repeats_suppressed"}
)


def _kind(record: logging.LogRecord) -> tuple[Any, ...]:
    """What makes two records the same: logger, level, message (with its fields), exception type and
    the place it was raised."""
    exc: Any = record.exc_info[1] if record.exc_info else None
    if isinstance(record.msg, dict):  # a structlog event
        event = record.msg
        text = str(event.get("event"))[:200]
        fields = tuple(
            sorted(
                (str(k), str(v)[:64])
                for k, v in event.items()
                if k != "event" and k not in _VOLATILE and not str(k).startswith("_")
            )
        )
        flag = event.get("exc_info")
        if flag is True:
            exc = sys.exc_info()[1]
        elif isinstance(flag, BaseException):
            exc = flag
        elif isinstance(flag, tuple) and len(flag) == 3:
            exc = flag[1]
    else:
        try:
            text = record.getMessage()[:200]
        except Exception:  # arguments that do not fit the message: its template then
            text = str(record.msg)[:200]
        fields = ()
    kind: tuple[Any, ...] = (record.name, record.levelno, text, fields)
    if isinstance(exc, BaseException):
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        where = (tb.tb_frame.f_code.co_filename, tb.tb_lineno) if tb is not None else None
        kind += (type(exc).__qualname__, where)
    return kind


def resolve_format(fmt: str, stream: TextIO) -> Literal["json", "console"]:
    """'auto' means console on a terminal and JSON lines otherwise."""
    match fmt:
        case "json" | "console":
            return fmt
        case "auto":
            isatty = getattr(stream, "isatty", None)
            return "console" if callable(isatty) and isatty() else "json"
    raise ValueError(f"log format must be auto, json or console, not {fmt!r}")


def configure_logging(
    level: str | int = "info",
    fmt: str = "auto",
    *,
    stream: TextIO | None = None,
    static: dict[str, Any] | None = None,
    secrets: Iterable[str | None] = (),
) -> Literal["json", "console"]:
    """Configure structlog and the root logger once per process; returns the format chosen.

    `secrets`: strings never to write (see register_secret)."""
    stream = stream or sys.stderr
    for secret in secrets:
        register_secret(secret)
    chosen = resolve_format(fmt, stream)
    level_no = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    if not isinstance(level_no, int):
        raise ValueError(f"unknown log level {level!r}")
    fixed = dict(static or {})

    def add_static(_logger: WrappedLogger, _name: str, event_dict: EventDict) -> EventDict:
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
        # the trace as data: no frame locals (they hold headers, tokens and bodies), a bounded number
        # of frames; `redact` then cleans its messages like every other field
        traces: Any = structlog.processors.ExceptionRenderer(
            structlog.tracebacks.ExceptionDictTransformer(
                show_locals=False, max_frames=TRACE_FRAMES, use_rich=False
            )
        )
        render: list[Any] = [structlog.processors.JSONRenderer(sort_keys=False, default=str)]
    else:
        traces = structlog.processors.format_exc_info  # plain text, no locals; rendered as it is
        render = [
            structlog.dev.ConsoleRenderer(
                colors=_colors(stream), exception_formatter=structlog.dev.plain_traceback
            )
        ]
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.ExtraAdder()],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            traces,
            redact,
            tidy,
            *render,
        ],
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    handler.addFilter(RepeatFilter())
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


def tidy(_logger: WrappedLogger, _name: str, event_dict: EventDict) -> dict[str, Any]:
    """Put timestamp, level, logger and event first; drop uvicorn's coloured duplicate."""
    for key in DROPPED_KEYS:
        event_dict.pop(key, None)
    head = {k: event_dict.pop(k) for k in FIRST_KEYS if k in event_dict}
    return {**head, **event_dict}


def _colors(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(callable(isatty) and isatty())


def request_id_from(value: str | None) -> str:
    """The caller's X-Request-ID when it is a UUID or a label of at most 20 characters (never the shape of
    a credential), else a fresh one."""
    if value and _VALID_REQUEST_ID.match(value):
        return value
    return secrets.token_hex(16)  # 32 hex digits, as a UUID's hex (uuid4 costs a UUID object)


_PATH_ID = re.compile(r"[0-9]{1,10}")  # ASCII digits only: str.isdigit() also takes '²', int() does not


def path_fields(path_params: dict[str, Any]) -> dict[str, Any]:
    """Log fields (federation_id, round, client_id) from a route's path parameters.

    A value that is not a plain decimal id is kept as the (redacted, bounded) string it was."""
    out: dict[str, Any] = {}
    for param, field in PATH_FIELDS.items():
        if param in path_params:
            value = path_params[param]
            if isinstance(value, str):
                value = int(value) if _PATH_ID.fullmatch(value) else redact_text(value[:64])
            out[field] = value
    return out


def bind_route_context(path_params: dict[str, Any]) -> None:
    """Bind a routed request's federation/round/client ids into the log context (call it in the
    request's task, once routed: the binding then reaches the endpoint's thread too)."""
    fields = path_fields(path_params)
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
        raw = None  # the last X-Request-ID header, as a dict of the headers would keep it
        for key, value in scope.get("headers") or ():
            if key == _REQUEST_ID_KEY:
                raw = value
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
                    (k, v) for k, v in message["headers"] if k.lower() != _REQUEST_ID_KEY
                ] + [(_REQUEST_ID_KEY, request_id.encode())]
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
