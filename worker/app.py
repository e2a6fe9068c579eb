"""The worker's FastAPI app: /healthz, /status, /metrics, with the agents' loops in its lifespan."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Response
from fedprompt.shared.apidocs import mount_api_docs
from fedprompt.worker.pool import Pool
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

log = logging.getLogger("fedprompt.worker")


class WorkerMetrics:
    """Prometheus metrics of one worker (own registry, so tests can build several apps)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.steps = Counter(
            "fedprompt_worker_training_steps", "Local training steps run.", registry=self.registry
        )
        self.step_seconds = Histogram(
            "fedprompt_worker_step_seconds",
            "Duration of one local training step.",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10),
            registry=self.registry,
        )
        self.eval_accuracy = Gauge(
            "fedprompt_worker_last_accuracy",
            "Accuracy of the latest global prompt on local held-out data.",
            registry=self.registry,
        )
        self.rounds = Gauge(
            "fedprompt_worker_rounds_trained", "Rounds this worker trained.", registry=self.registry
        )


def create_app(pool: Pool, metrics: WorkerMetrics) -> FastAPI:
    """The worker service around a pool of agents (one for `serve`); they run while the app lives."""
    for agent in pool.agents:
        agent.metrics = metrics

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool.start()
        yield
        pool.stop()

    app = FastAPI(title="fedprompt worker", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None)
    mount_api_docs(app)  # /docs and /redoc from the package's assets, not a CDN

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        """The process is alive."""
        return {"status": "ok"}

    @app.get("/status")
    def status() -> dict[str, Any]:
        """State, current round, training progress, last metrics (per client when the pool has several)."""
        if len(pool.agents) == 1:
            return pool.agents[0].status.as_dict()
        return {"clients": pool.status()}

    @app.get("/metrics")
    def prometheus() -> Response:
        """Prometheus metrics."""
        metrics.rounds.set(sum(len(a.status.rounds_trained) for a in pool.agents))
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
