"""Raw request bodies read by the routes themselves (safetensors uploads, the login form): within a
size limit, and for uploads within their client's share of the bytes in flight (inflight.py)."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fedprompt.coordinator.errors import Invalid, TooLarge
from fedprompt.coordinator.hosting.inflight import Ticket

# The OpenAPI of routes that read a raw safetensors body themselves (read_limited_body).
SAFETENSORS_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "A safetensors file: the prompt tensors, metadata in its header.",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}


async def read_limited_body(request: Request, limit: int, ticket: Ticket | None = None) -> bytes:
    """Read a request body, refusing it (413) as soon as it exceeds `limit` bytes.

    With a ticket of the upload gate, the declared size is reserved before a byte is read and what
    streams in past it is counted as it arrives (429 when the holder's bytes in flight are over)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise Invalid("invalid Content-Length header") from None
        if size > limit:
            raise TooLarge(f"body of {size} bytes exceeds the upload limit of {limit} bytes")
        if ticket is not None:
            ticket.add(size)
    # one growing buffer rather than a list of chunks: one large allocation, which the allocator
    # hands back to the system when a cut-off upload drops it, instead of thousands of small ones
    body = bytearray()
    async for chunk in request.stream():
        if len(body) + len(chunk) > limit:
            raise TooLarge(f"body exceeds the upload limit of {limit} bytes")
        body += chunk
        if ticket is not None and len(body) > ticket.bytes:
            ticket.add(len(body) - ticket.bytes)
    return bytes(body)


def upload_ticket(request: Request, holder: int | str) -> Ticket:
    """A place among the uploads in progress of a client (or 'admin'), or 429 (see inflight.py)."""
    return request.app.state.upload_gate.open(holder)
