"""Who is calling: the one authorisation check of every non-public route (`authorize`), per scope.

The admin authenticates with ``Authorization: Bearer <FEDPROMPT_ADMIN_TOKEN>`` (curl, the CLI) or
with the dashboard's session cookie (session.py: then state-changing methods also need its CSRF
header). A client's token names one active client of one federation, and a client only ever acts
as that client. Failed authentications are counted per address (ratelimit_dep.py).
"""

from __future__ import annotations

import hmac
from enum import StrEnum

from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fedprompt.coordinator.api.ratelimit_dep import WrongAdminToken, counting_failures
from fedprompt.coordinator.api.session import SESSION_COOKIE, check_csrf, has_session, uses_session
from fedprompt.coordinator.api.tls import check_client_certificate
from fedprompt.coordinator.config import Settings
from fedprompt.coordinator.errors import Unauthorized
from fedprompt.coordinator.persistence.db import Client
from fedprompt.coordinator.service import Coordinator


def bearer_token(request: Request) -> str:
    """The bearer token of a request, or '' if it sends none."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def bearer(request: Request) -> str:
    """The bearer token of a request, or a 401 that says how to send one."""
    token = bearer_token(request)
    if not token:
        raise Unauthorized("missing bearer token: send the header 'Authorization: Bearer <token>'")
    return token


def is_admin_token(token: str, settings: Settings) -> bool:
    """Constant-time comparison with FEDPROMPT_ADMIN_TOKEN."""
    return hmac.compare_digest(token.encode(), settings.admin_secret().encode())


class Scope(StrEnum):
    """Who may call a route: the single authorisation check of every non-public route."""

    ADMIN = "admin"
    CLIENT = "client"
    ADMIN_OR_CLIENT = "admin-or-client"
    ENROLMENT = "enrolment"


def authorize(
    request: Request,
    scope: Scope,
    settings: Settings,
    service: Coordinator | None = None,
    fid: int | None = None,
) -> Client | None:
    """Check the caller against a scope: None for the admin, the Client for a client token.

    Admin: the bearer token equals FEDPROMPT_ADMIN_TOKEN (constant-time), or a dashboard session
    cookie (then state-changing methods also need the CSRF header). Client: the token's sha256
    names an active client of federation `fid`; a client only ever acts as that client.
    """
    request.state.auth_scope = scope
    if scope is Scope.ADMIN and uses_session(request):
        assert service is not None
        cookie = request.cookies.get(SESSION_COOKIE, "")
        with counting_failures(request, count=False, credential=cookie):  # a stale cookie is not a guess
            if not has_session(request, settings, service):
                raise Unauthorized(
                    "the dashboard session expired or is invalid; log in again at /dashboard/login"
                )
        check_csrf(request)
        return None
    with counting_failures(request, credential=bearer_token(request)):
        token = bearer(request)
        if scope is Scope.ADMIN:
            if not is_admin_token(token, settings):
                raise WrongAdminToken("this endpoint needs the admin token (FEDPROMPT_ADMIN_TOKEN)")
            return None
        if scope is Scope.ADMIN_OR_CLIENT and is_admin_token(token, settings):
            return None
        assert service is not None and fid is not None
        client = service.enrolment.authenticate_client(fid, token)
    check_client_certificate(request, client, settings)
    request.state.client_id = client.id  # for the access log and per-client refusal counts
    return client


async def authorize_client(
    request: Request, scope: Scope, settings: Settings, service: Coordinator, fid: int
) -> Client | None:
    """`authorize` on the event loop when it needs no database (an admin token, a client token in the
    service's authentication cache), else in a thread. An entry that expires between the two checks
    costs one lookup on the loop."""
    token = bearer_token(request)
    if service.enrolment.cached_client(token) is not None or (
        scope is Scope.ADMIN_OR_CLIENT and is_admin_token(token, settings)
    ):
        return authorize(request, scope, settings, service, fid)
    return await run_in_threadpool(authorize, request, scope, settings, service, fid)


# OpenAPI security schemes: they document which token each route takes (and give /docs its
# "Authorize" button); the checking is `authorize`'s, which answers problem+json.
admin_scheme = HTTPBearer(
    scheme_name="admin",
    description="FEDPROMPT_ADMIN_TOKEN (the dashboard's session cookie also works).",
    auto_error=False,
)
client_scheme = HTTPBearer(
    scheme_name="client", description="The client token returned by enrolment.", auto_error=False
)
enrolment_scheme = HTTPBearer(
    scheme_name="enrolment",
    description="An enrolment token issued by the operator (POST .../enrollment-tokens).",
    auto_error=False,
)
Credentials = HTTPAuthorizationCredentials | None
