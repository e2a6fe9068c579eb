"""The framework's own ceiling: a minimal FastAPI app that accepts the same requests and does nothing.

    python -m bench.null_server --port PORT --tokens 20 --hidden 384

Enrolment answers a fixed token, a prompt download answers a fixed safetensors blob of the same
size, an upload reads the whole body and answers 201 with a small JSON — no database, no checks.
"""

from __future__ import annotations

import argparse
import itertools

import numpy as np
import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from shared import wire


def create_app(tokens: int, hidden: int) -> FastAPI:
    """The null app."""
    app = FastAPI()
    blob = wire.encode({"prompt_embeddings": np.zeros((tokens, hidden), np.float32)}, {"version": "0"})
    ids = itertools.count(1)

    @app.get("/readyz")
    def ready() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/api/v1/federations/{fid}/clients", status_code=201)
    async def enrol(fid: int, request: Request) -> dict[str, object]:
        await request.body()
        return {"client_id": next(ids), "token": "fpc_null"}

    @app.get("/api/v1/federations/{fid}/prompts/{version}")
    async def prompt(fid: int, version: int) -> Response:
        return Response(blob, media_type="application/octet-stream")

    @app.put("/api/v1/federations/{fid}/rounds/{number}/update")
    async def upload(fid: int, number: int, request: Request) -> JSONResponse:
        body = await request.body()
        return JSONResponse({"round": number, "size": len(body)}, status_code=201)

    return app


def main() -> None:
    """Serve the null app on loopback."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--tokens", type=int, default=20)
    ap.add_argument("--hidden", type=int, default=384)
    args = ap.parse_args()
    uvicorn.run(create_app(args.tokens, args.hidden), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
