"""The coordinator's FastAPI application."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool

from coordinator.api import problems
from coordinator.api.routes import clients, federations, health, rounds
from coordinator.config import Settings
from coordinator.db import make_engine, make_sessionmaker
from coordinator.service import Coordinator

log = logging.getLogger("fedprompt.coordinator")


async def _sweeper(service: Coordinator, interval: float) -> None:
    """Enforce deadlines and open due rounds; every process runs one, the DB lock makes it safe."""
    while True:
        try:
            await run_in_threadpool(service.sweep)
        except Exception:  # keep sweeping: a transient DB error must not stop deadlines
            log.exception("sweep failed")
        await asyncio.sleep(interval)


def create_app(settings: Settings, *, sweep: bool = True) -> FastAPI:
    """Build the app for a settings object (admin token already resolved)."""
    engine = make_engine(settings.url)
    service = Coordinator(make_sessionmaker(engine))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(_sweeper(service, settings.sweep_interval_s)) if sweep else None
        yield
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        engine.dispose()

    app = FastAPI(
        title="fedprompt coordinator",
        version="0.1.0",
        description="Federated prompt tuning: rounds, enrolment, uploads and aggregation of soft prompts.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.service = service
    problems.install(app)
    for module in (health, federations, clients, rounds):
        app.include_router(module.router)
    return app
