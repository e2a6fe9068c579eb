"""Request size limits applied before the body is read (pure ASGI middleware).

A route's first read of a body whose declared ``Content-Length`` is over the limit fails with 413
before a byte of it is received; a body sent without one (chunked) is counted as it streams in and
refused (413) as soon as it passes the limit. A route that never reads its body never receives it. Uploads of prompts (``PUT …/rounds/{n}/update``, ``PUT …/prompts/0``) may
be up to FEDPROMPT_MAX_UPLOAD_BYTES; every other body up to FEDPROMPT_MAX_REQUEST_BYTES.

A body must also arrive whole within FEDPROMPT_BODY_TIMEOUT_S of the route's first read of it: a
client that stalls or trickles is answered 408 with ``Connection: close``, so the server closes the
connection and frees what it held (uvicorn's own timeouts do not cover a body in progress).

Every other body (JSON, the login form) counts towards its address's bytes in flight, at most
FEDPROMPT_MAX_REQUEST_BYTES_IN_FLIGHT_PER_ADDRESS: FastAPI reads such a body before the route checks
any token, so without this one address could make the coordinator hold a body per connection.
Past it, 429 with Retry-After. Uploads are read only after their client's token is checked, and
are capped per client by the route (inflight.py).
"""

from __future__ import annotations

import anyio
from fastapi import HTTPException
from fedprompt.coordinator.hosting.inflight import Ticket, UploadGate
from fedprompt.coordinator.hosting.paths import UPLOAD_PATHS
from fedprompt.coordinator.hosting.ratelimit import RateLimited
from starlette.types import ASGIApp, Message, Receive, Scope, Send


def _too_large(size: int | None, limit: int, upload: bool) -> str:
    knob = "FEDPROMPT_MAX_UPLOAD_BYTES" if upload else "FEDPROMPT_MAX_REQUEST_BYTES"
    what = f"body of {size} bytes" if size is not None else "body"
    return f"{what} exceeds this coordinator's limit of {limit} bytes ({knob})"


class BodyLimitMiddleware:
    """Refuse request bodies over the limit of their route (413 problem+json)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        request_limit: int,
        upload_limit: int,
        body_timeout_s: float = 60.0,
        in_flight_per_address: int | None = None,
    ) -> None:
        self.app = app
        self.request_limit = request_limit
        self.upload_limit = upload_limit
        self.body_timeout_s = body_timeout_s
        self.per_address = (
            None
            if in_flight_per_address is None
            else UploadGate(
                2**31,
                in_flight_per_address,
                what="request bodies",
                count_knob="-",
                bytes_knob="FEDPROMPT_MAX_REQUEST_BYTES_IN_FLIGHT_PER_ADDRESS",
            )
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        upload = scope["method"] == "PUT" and bool(UPLOAD_PATHS.match(scope["path"]))
        limit = self.upload_limit if upload else self.request_limit
        declared = _content_length(scope)
        received = 0
        deadline: float | None = None
        complete = False
        ticket: Ticket | None = None
        if self.per_address is not None and not upload:
            client = scope.get("client")
            ticket = self.per_address.open(("address", client[0] if client else "unknown"))

        async def limited_receive() -> Message:
            # Raised inside the route's body read, so the app's handler answers 413 problem+json and
            # the request has been routed (logs and metrics see which route it was).
            nonlocal received, deadline, complete
            if declared is not None and declared > limit:
                raise HTTPException(413, _too_large(declared, limit, upload))  # not a byte read
            if complete:  # the body is in: what follows is a wait for the client's disconnect
                return await receive()
            if deadline is None:
                deadline = anyio.current_time() + self.body_timeout_s
            with anyio.move_on_after(max(0.0, deadline - anyio.current_time())) as waited:
                message = await receive()
            if waited.cancelled_caught:
                raise HTTPException(
                    408,
                    f"the request body did not arrive within {self.body_timeout_s:g} s "
                    "(FEDPROMPT_BODY_TIMEOUT_S); send it at once",
                    headers={"Connection": "close"},  # uvicorn closes the connection after the answer
                )
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise HTTPException(413, _too_large(None, limit, upload))
                if ticket is not None and received > ticket.bytes:
                    try:
                        ticket.add(received - ticket.bytes)
                    except RateLimited as exc:  # an HTTPException: FastAPI's body read passes it on
                        raise HTTPException(429, exc.detail, headers=exc.headers) from None
                complete = not message.get("more_body", False)
            return message

        try:
            await self.app(scope, limited_receive, send)
        finally:
            if ticket is not None:
                ticket.close()


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server rejects a malformed header itself
    return None
