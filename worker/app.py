"""The worker's FastAPI app: /healthz, /status, /metrics, with the agents' loops in its lifespan.

Everything but /healthz shows what a site would rather keep to itself (client ids, rounds, losses,
its data sizes, its local evaluation), so with a token (FEDPROMPT_WORKER_TOKEN or _FILE) every other
path (/status, /metrics, /docs, /openapi.json) needs ``Authorization: Bearer <token>``; the CLI
refuses to bind a non-loopback address without one. /status leaves out the local evaluation's
counts and the data sizes unless asked (``?detail=full``).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
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


PUBLIC_PATHS = frozenset({"/healthz"})
# What /status leaves out unless asked: the site's data sizes and its local evaluation's details.
DETAIL_FIELDS = ("num_train", "num_eval")


def brief(status: dict[str, Any]) -> dict[str, Any]:
    """A client's /status without its data sizes and with only the accuracy of its last evaluation."""
    out = {k: v for k, v in status.items() if k not in DETAIL_FIELDS}
    if isinstance(out.get("last_eval"), dict):
        out["last_eval"] = {k: out["last_eval"][k] for k in ("version", "accuracy") if k in out["last_eval"]}
    return out


def create_app(pool: Pool, metrics: WorkerMetrics, *, token: str | None = None) -> FastAPI:
    """The worker service around a pool of agents (one for `serve`); they run while the app lives.
    With `token`, every path but /healthz needs it as a bearer token."""
    for agent in pool.agents:
        agent.metrics = metrics

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool.start()
        yield
        pool.stop()

    app = FastAPI(title="fedprompt worker", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None)
    mount_api_docs(app)  # /docs and /redoc from the package's assets, not a CDN

    if token:
        expected = f"Bearer {token}".encode()

        @app.middleware("http")
        async def require_token(request: Request, call_next: Any) -> Response:
            given = request.headers.get("authorization", "").encode()
            if request.url.path in PUBLIC_PATHS or hmac.compare_digest(given, expected):
                return await call_next(request)
            return JSONResponse(
                {
                    "type": "about:blank",
                    "title": "Unauthorized",
                    "status": 401,
                    "detail": "this worker's API needs its token: send 'Authorization: Bearer <FEDPROMPT_WORKER_TOKEN>'",
                    "instance": request.url.path,
                },
                status_code=401,
                media_type="application/problem+json",
                headers={"WWW-Authenticate": "Bearer"},
            )

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        """The process is alive."""
        return {"status": "ok"}

    @app.get("/status")
    def status(detail: str = "brief") -> dict[str, Any]:
        """State, current round, training progress, last accuracy (per client when the pool has several);
        ``?detail=full`` adds the data sizes and the last local evaluation's details."""
        shown = (lambda s: s) if detail == "full" else brief
        if len(pool.agents) == 1:
            return shown(pool.agents[0].status.as_dict())
        return {"clients": [shown(s) for s in pool.status()]}

    @app.get("/metrics")
    def prometheus() -> Response:
        """Prometheus metrics."""
        metrics.rounds.set(sum(len(a.status.rounds_trained) for a in pool.agents))
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
