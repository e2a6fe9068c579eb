"""Dependencies shared by routes: the service, admin auth and client auth."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request

from coordinator.config import Settings
from coordinator.db import Client
from coordinator.errors import Forbidden, Invalid, TooLarge, Unauthorized
from coordinator.service import Coordinator


def bearer(request: Request) -> str:
    """The bearer token of a request, or a 401 that says how to send one."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("missing bearer token: send the header 'Authorization: Bearer <token>'")
    return token.strip()


def get_service(request: Request) -> Coordinator:
    """The coordinator service of this app."""
    return request.app.state.service


def get_settings(request: Request) -> Settings:
    """The settings of this app."""
    return request.app.state.settings


ServiceDep = Annotated[Coordinator, Depends(get_service)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
TokenDep = Annotated[str, Depends(bearer)]


def require_admin(token: TokenDep, settings: SettingsDep) -> None:
    """Admin routes: the token must equal FEDPROMPT_ADMIN_TOKEN (constant-time comparison)."""
    if not hmac.compare_digest(token.encode(), settings.admin_secret().encode()):
        raise Forbidden("this endpoint needs the admin token (FEDPROMPT_ADMIN_TOKEN)")


def require_client(fid: int, token: TokenDep, service: ServiceDep) -> Client:
    """Client routes: the token must belong to an active client of this federation."""
    return service.authenticate_client(fid, token)


AdminDep = Depends(require_admin)
ClientDep = Annotated[Client, Depends(require_client)]


def require_admin_or_client(
    fid: int, token: TokenDep, service: ServiceDep, settings: SettingsDep
) -> Client | None:
    """Routes both sides use: None for the admin, else the authenticated client."""
    if hmac.compare_digest(token.encode(), settings.admin_secret().encode()):
        return None
    return service.authenticate_client(fid, token)


EitherDep = Annotated[Client | None, Depends(require_admin_or_client)]


async def read_limited_body(request: Request, limit: int) -> bytes:
    """Read a request body, refusing it (413) as soon as it exceeds `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise Invalid("invalid Content-Length header") from None
        if size > limit:
            raise TooLarge(f"body of {size} bytes exceeds the upload limit of {limit} bytes")
    chunks, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise TooLarge(f"body exceeds the upload limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
