"""The framework's own ceiling: a minimal FastAPI app that answers the workers' requests and stores nothing.

    python -m bench.null_server --port PORT --clients K --rounds 2 --fraction 1.0 --tokens 20 --hidden 384

It speaks the part of the coordinator's protocol the load generator uses, with the round logic kept
in memory and no checks: enrolment answers a token; ``GET …/task?wait=W`` long-polls as the
coordinator's does (evaluate the latest version not yet evaluated by this client, train while the
client is selected for the open round and has not uploaded, done once the last round closed);
downloads answer a fixed safetensors blob of the prompt's size; an upload reads the body and counts
it, and the round's last upload makes the next version and opens the next round, as the
coordinator's does. ``GET …/rounds`` answers the same history fields, so task delivery is measured
the same way on both.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import random
import time
from typing import Any

import numpy as np
import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from fedprompt.shared import wire

SHA = "0" * 64


class Rounds:
    """The round state a coordinator keeps, in memory: who enrolled, who is selected, who uploaded."""

    def __init__(self, clients: int, rounds: int, fraction: float, seed: int = 0) -> None:
        self.clients = clients
        self.rounds = rounds
        self.fraction = fraction
        self.rng = random.Random(seed)
        self.enrolled = 0
        self.latest = 0
        self.current = 0
        self.selected: set[int] = set()
        self.uploaded: set[int] = set()
        self.evaluated: dict[int, int] = {}
        self.history: list[dict[str, Any]] = []
        self.changed = asyncio.Event()

    @property
    def completed(self) -> bool:
        """The last round closed."""
        return self.latest >= self.rounds

    def enrol(self) -> int:
        """A new client's id; the first round opens once every expected client enrolled."""
        self.enrolled += 1
        cid = self.enrolled
        if self.enrolled == self.clients:
            self._open()
        return cid

    def _open(self) -> None:
        self.current += 1
        n = max(1, math.ceil(self.fraction * self.clients))
        self.selected = set(self.rng.sample(range(1, self.clients + 1), n))
        self.uploaded = set()
        self.history.append(
            {"round": self.current, "state": "open", "opened_at": time.time(), "closed_at": None}
        )
        self._notify()

    def _notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def task(self, cid: int) -> dict[str, Any] | None:
        """What this client should do now, as the coordinator's ``next_task`` decides it."""
        if self.evaluated.get(cid, -1) < self.latest:
            return {"kind": "evaluate", "round": self.latest, "version": self.latest, "sha256": SHA}
        if self.history and self.history[-1]["state"] == "open" and cid in self.selected - self.uploaded:
            return {"kind": "train", "round": self.current, "version": self.latest, "sha256": SHA}
        if self.completed:
            return {"kind": "done", "round": self.current, "version": self.latest}
        return None

    def upload(self, cid: int, number: int) -> None:
        """Count an upload; the round's last one makes the next version and opens the next round."""
        if number != self.current or cid not in self.selected:
            return
        self.uploaded.add(cid)
        if self.uploaded == self.selected:
            self.latest += 1
            self.history[-1].update(state="closed", closed_at=time.time(), result_version=self.latest)
            if self.completed:
                self._notify()
            else:
                self._open()

    def evaluate(self, cid: int, version: int) -> None:
        """Record that this client evaluated a version."""
        self.evaluated[cid] = max(self.evaluated.get(cid, -1), version)


def create_app(
    tokens: int, hidden: int, *, clients: int = 1, rounds: int = 2, fraction: float = 1.0
) -> FastAPI:
    """The null app."""
    app = FastAPI()
    blob = wire.encode({"prompt_embeddings": np.zeros((tokens, hidden), np.float32)}, {"version": "0"})
    state = Rounds(clients, rounds, fraction)

    def client_id(request: Request) -> int:
        return int(request.headers.get("authorization", "Bearer fpc_0").rsplit("_", 1)[1])

    @app.get("/readyz")
    def ready() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/api/v1/federations/{fid}/clients", status_code=201)
    async def enrol(fid: int, request: Request) -> dict[str, object]:
        await request.body()
        cid = state.enrol()
        return {"client_id": cid, "token": f"fpc_{cid}"}

    @app.get("/api/v1/federations/{fid}/task", response_model=None)
    async def task(fid: int, request: Request, wait: float = 0.0) -> dict[str, Any] | Response:
        cid = client_id(request)
        deadline = time.monotonic() + wait
        while True:
            found = state.task(cid)
            left = deadline - time.monotonic()
            if found is not None or left <= 0:
                return found if found is not None else Response(status_code=204)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(state.changed.wait(), left)

    @app.get("/api/v1/federations/{fid}/prompts/{version}")
    async def prompt(fid: int, version: int) -> Response:
        return Response(blob, media_type="application/octet-stream")

    @app.put("/api/v1/federations/{fid}/rounds/{number}/update")
    async def upload(fid: int, number: int, request: Request) -> JSONResponse:
        body = await request.body()
        state.upload(client_id(request), number)
        return JSONResponse({"round": number, "size": len(body)}, status_code=201)

    @app.post("/api/v1/federations/{fid}/rounds/{version}/evaluation")
    async def evaluation(fid: int, version: int, request: Request) -> dict[str, bool]:
        await request.body()
        state.evaluate(client_id(request), version)
        return {"recorded": True}

    @app.get("/api/v1/federations/{fid}/rounds")
    async def history(fid: int) -> list[dict[str, Any]]:
        return state.history

    return app


def main() -> None:
    """Serve the null app on loopback."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--fraction", type=float, default=1.0)
    ap.add_argument("--tokens", type=int, default=20)
    ap.add_argument("--hidden", type=int, default=384)
    args = ap.parse_args()
    app = create_app(
        args.tokens, args.hidden, clients=args.clients, rounds=args.rounds, fraction=args.fraction
    )
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
