"""The routes' dependencies: what the app holds, and the one authorisation dependency per scope.

Every route that needs a token depends on exactly one of `require_admin`, `require_client`,
`require_admin_or_client` or `require_enrolment`; each is a thin wrapper of `authorize` (auth.py)
for its scope (tests/coordinator/test_security.py walks the routes to hold this). Failed
authentications and enrolments are rate-limited per IP (ratelimit_dep.py, coordinator/hosting/ratelimit.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

import anyio
from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from fedprompt.coordinator.api.auth import (
    Credentials,
    Scope,
    admin_scheme,
    authorize,
    authorize_client,
    bearer,
    bearer_token,
    client_scheme,
    enrolment_scheme,
)
from fedprompt.coordinator.api.longpoll import TaskPoll
from fedprompt.coordinator.api.ratelimit_dep import client_ip, counting_failures, get_rate_limiter
from fedprompt.coordinator.api.schemas import IdPath
from fedprompt.coordinator.api.session import uses_session
from fedprompt.coordinator.config import Settings
from fedprompt.coordinator.metrics import CoordinatorMetrics
from fedprompt.coordinator.persistence.db import Client
from fedprompt.coordinator.service import Coordinator

# Dependencies that do no I/O are `async def`: FastAPI runs a plain `def` dependency in the request
# thread pool, one hop (and a queue behind every busy thread) per dependency per request.


async def get_service(request: Request) -> Coordinator:
    """The coordinator service of this app."""
    return request.app.state.service


async def get_settings(request: Request) -> Settings:
    """The settings of this app."""
    return request.app.state.settings


async def get_metrics(request: Request) -> CoordinatorMetrics:
    """The Prometheus metrics of this app."""
    return request.app.state.metrics


async def get_task_poll(request: Request) -> TaskPoll:
    """The task long-poll of this app."""
    return request.app.state.task_poll


async def get_upload_threads(request: Request) -> anyio.CapacityLimiter:
    """The threads uploads run in (FEDPROMPT_UPLOAD_THREADS), apart from the request threads."""
    return request.app.state.upload_threads.get()


ServiceDep = Annotated[Coordinator, Depends(get_service)]
MetricsDep = Annotated[CoordinatorMetrics, Depends(get_metrics)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
TaskPollDep = Annotated[TaskPoll, Depends(get_task_poll)]
UploadThreadsDep = Annotated[anyio.CapacityLimiter, Depends(get_upload_threads)]
TokenDep = Annotated[str, Depends(bearer)]


# The authorisation dependencies read the service and settings off the app rather than through
# dependencies of their own: FastAPI solves every dependency of every request anew, and these run on
# every authenticated request (a thousand workers' polls).


async def require_admin(request: Request, _: Annotated[Credentials, Depends(admin_scheme)]) -> None:
    """Admin routes (the session cookie's check reads the database: in a thread)."""
    settings: Settings = request.app.state.settings
    service: Coordinator = request.app.state.service
    if uses_session(request):
        await run_in_threadpool(authorize, request, Scope.ADMIN, settings, service)
    else:
        authorize(request, Scope.ADMIN, settings)


async def client_of(request: Request, fid: int) -> Client:
    """The active client of federation `fid` whose token the request carries (else a refusal)."""
    app = request.app
    client = await authorize_client(request, Scope.CLIENT, app.state.settings, app.state.service, fid)
    assert client is not None
    return client


async def admin_or_client_of(request: Request, fid: int) -> Client | None:
    """None for the admin, else the active client of federation `fid` (else a refusal)."""
    app = request.app
    return await authorize_client(request, Scope.ADMIN_OR_CLIENT, app.state.settings, app.state.service, fid)


async def require_client(
    request: Request, fid: IdPath, _: Annotated[Credentials, Depends(client_scheme)]
) -> Client:
    """Client routes: the token must belong to an active client of this federation."""
    return await client_of(request, fid)


async def require_admin_or_client(
    request: Request,
    fid: IdPath,
    _a: Annotated[Credentials, Depends(admin_scheme)],
    _c: Annotated[Credentials, Depends(client_scheme)],
) -> Client | None:
    """Routes both sides use: None for the admin, else the authenticated client."""
    return await admin_or_client_of(request, fid)


async def require_enrolment(
    request: Request, fid: IdPath, _: Annotated[Credentials, Depends(enrolment_scheme)]
) -> AsyncIterator[str]:
    """The enrolment route: rate-limited per IP; the token itself is checked by the enrolment.

    A refused enrolment token (unknown, expired, used up) counts as a failed authentication.
    """
    del fid  # part of the route; the service checks the token against it
    request.state.auth_scope = Scope.ENROLMENT
    with counting_failures(request, credential=bearer_token(request)):
        get_rate_limiter(request).hit_enrolment(client_ip(request))
        yield bearer(request)


AdminDep = Depends(require_admin)
ClientDep = Annotated[Client, Depends(require_client)]
EitherDep = Annotated[Client | None, Depends(require_admin_or_client)]
EnrolmentDep = Annotated[str, Depends(require_enrolment)]
AUTH_DEPENDENCIES = (require_admin, require_client, require_admin_or_client, require_enrolment)
