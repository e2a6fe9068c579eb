"""The coordinator's FastAPI application."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.to_thread
from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from fastapi.staticfiles import StaticFiles
from fedprompt.coordinator.api import problems
from fedprompt.coordinator.api.body_limit import BodyLimitMiddleware
from fedprompt.coordinator.api.longpoll import TaskPoll
from fedprompt.coordinator.api.perloop import PerLoop
from fedprompt.coordinator.api.routes import clients, dashboard, export, federations, health, rounds, secagg
from fedprompt.coordinator.config import Settings
from fedprompt.coordinator.dashboard import STATIC_DIR
from fedprompt.coordinator.hosting.inflight import UploadGate
from fedprompt.coordinator.hosting.ratelimit import RateLimiter
from fedprompt.coordinator.metrics import (
    CoordinatorMetrics,
    MetricsMiddleware,
    RoundTransition,
    instrument_sessions,
    log_transition,
)
from fedprompt.coordinator.persistence.db import make_engine, make_sessionmaker
from fedprompt.coordinator.persistence.notify import ChangeListener
from fedprompt.coordinator.service import Coordinator
from fedprompt.shared.apidocs import mount_api_docs
from fedprompt.shared.logs import RequestContextMiddleware, register_secret

log = logging.getLogger("fedprompt.coordinator")


async def _sweeper(service: Coordinator, interval: float) -> None:
    """Enforce deadlines and open due rounds; every process runs one, the DB lock makes it safe."""
    while True:
        try:
            await run_in_threadpool(service.cycle.sweep)
        except Exception:  # keep sweeping: a transient DB error must not stop deadlines
            log.exception("sweep failed")
        await asyncio.sleep(interval)


def no_telemetry() -> dict[str, Any]:
    """FastAPI's own OpenTelemetry hooks off, as FastAPI's keyword arguments: every switch of its
    TelemetryConfig that makes a request do telemetry work. Older FastAPI releases, which the
    dependency range admits, have no such hooks and no such argument: nothing to switch off."""
    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return {}
    return {"telemetry": {"tracing": False, "metrics": False, "logs": False, "operation_spans": False}}


def create_app(settings: Settings, *, sweep: bool = True) -> FastAPI:
    """Build the app for a settings object (admin token already resolved)."""
    register_secret(settings.admin_secret())  # never written to a log line, wherever it appears
    # a connection for every thread that can hold one at a time: the request threads, the upload
    # thread writing a batch (the others wait for it without one), the sweep, the long-polls' reader
    engine = make_engine(settings.url, pool_size=settings.threads + 3)
    sessions = make_sessionmaker(engine)
    service = Coordinator(
        sessions,
        auth_cache_s=settings.auth_cache_s,
        default_round_deadline_s=settings.default_round_deadline_s,
        max_prompt_bytes=settings.max_upload_bytes,
    )
    metrics = CoordinatorMetrics(service.reads.gauge_counts)

    def on_round_transition(transition: RoundTransition) -> None:
        metrics.round_transition(transition)
        log_transition(transition)

    instrument_sessions(sessions, on_round_transition)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.threads
        task = asyncio.create_task(_sweeper(service, settings.sweep_interval_s)) if sweep else None
        # other processes' changes, announced through Postgres NOTIFY (SQLite: one process, no replicas)
        listener = (
            ChangeListener(engine.url, service.store.changed, on_revoked=service.enrolment.forget_token)
            if service.store.notify
            else None
        )
        if listener is not None:
            listener.start()
        yield
        if listener is not None:
            listener.stop()
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        service.store.downloads.flush()  # what the last downloads left in memory
        engine.dispose()

    app = FastAPI(
        title="fedprompt coordinator",
        version="0.1.0",
        description="Federated prompt tuning: rounds, enrolment, uploads and aggregation of soft prompts.",
        lifespan=lifespan,
        docs_url=None,  # /docs and /redoc from the package's own assets (mount_api_docs), not a CDN
        redoc_url=None,
        # the coordinator reports through Prometheus and its access log; FastAPI's hooks asked the
        # global tracer, meter and logger providers (reading the environment) on every request
        **no_telemetry(),
    )
    app.state.settings = settings
    app.state.service = service
    app.state.metrics = metrics
    app.state.task_poll = TaskPoll(service, settings.long_poll_interval_s, settings.long_poll_max_s)
    app.state.upload_threads = PerLoop(lambda: anyio.CapacityLimiter(settings.upload_threads))
    app.state.upload_gate = UploadGate(
        settings.max_uploads_per_client,
        settings.max_upload_bytes_in_flight_per_client,
        max_total_bytes=settings.max_upload_bytes_in_flight,
    )
    app.state.rate_limiter = RateLimiter(
        enrolment=settings.enrolment_rate_limit,
        failed_auth=settings.failed_auth_rate_limit,
        enabled=settings.rate_limits,
    )
    problems.install(app)
    # the routers whose routes take the most requests first (a request is matched in this order)
    for module in (rounds, federations, clients, secagg, health, export, dashboard):
        app.include_router(module.router)
    app.mount("/dashboard/static", StaticFiles(directory=STATIC_DIR), name="dashboard-static")
    mount_api_docs(app)
    # Added innermost first: the request id and log context wrap everything, metrics see every
    # response, and bodies over the limit are refused before any route reads them. No CORS
    # middleware: browsers refuse cross-origin calls (the dashboard is served from the same origin).
    app.add_middleware(
        BodyLimitMiddleware,
        request_limit=settings.max_request_bytes,
        upload_limit=settings.max_upload_bytes,
        body_timeout_s=settings.body_timeout_s,
        in_flight_per_address=settings.max_request_bytes_in_flight_per_address,
    )
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    app.add_middleware(RequestContextMiddleware)
    return app
