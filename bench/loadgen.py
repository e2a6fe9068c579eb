"""Load generator: K simulated workers (asyncio + aiohttp) driving one coordinator through full rounds.

Run by ``bench.ingest`` as a separate process; writes one JSON file of latencies and counts.

Each simulated worker enrols with the enrolment token, then loops as the real agent does: long-poll
``GET …/task?wait=W``; for an *evaluate* task download the version and report an evaluation; for a
*train* task download the base version unless it is the version it last downloaded (the real agent
keeps that one, checked by its sha256), "train" for a random time in [0, train_s] (the spread of
real local training, compressed) and upload a valid safetensors update; stop at *done*.
``--null`` drives the minimal endpoint of ``bench.null_server`` instead: enrol, then per round
download and upload the same bytes with the same pacing, nothing else.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from shared import wire

API = "/api/v1/federations"


class Recorder:
    """Latencies per request kind, errors, and when tasks arrived."""

    def __init__(self) -> None:
        self.lat: dict[str, list[float]] = defaultdict(list)
        self.errors: dict[str, int] = defaultdict(int)
        self.error_samples: list[str] = []
        self.received: list[tuple[str, int, float]] = []  # (kind, round/version, wall time)
        self.upload_times: list[tuple[int, float]] = []  # (round, wall time of the acknowledgement)
        self.trace: list[tuple[str, float, float]] = []  # (kind, wall time sent, seconds to answer)

    def error(self, what: str, detail: str) -> None:
        """Count an error and keep a few examples."""
        self.errors[what] += 1
        if len(self.error_samples) < 20:
            self.error_samples.append(f"{what}: {detail[:300]}")


@dataclass
class Answer:
    """A response's status and body, read whole (the latency includes reading the body)."""

    status_code: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


async def _request(
    rec: Recorder, kind: str, http: aiohttp.ClientSession, method: str, url: str, **kw: Any
) -> Answer | None:
    sent, t0 = time.time(), time.perf_counter()
    try:
        async with http.request(method, url, **kw) as resp:
            answer = Answer(resp.status, await resp.read())
    except (aiohttp.ClientError, TimeoutError) as exc:
        rec.error(f"{kind} {type(exc).__name__}", str(exc))
        return None
    dt = time.perf_counter() - t0
    if answer.status_code >= 400:
        rec.error(f"{kind} {answer.status_code}", answer.body.decode(errors="replace"))
        return None
    rec.lat[kind].append(dt)
    rec.trace.append((kind, sent, dt))
    return answer


class Blobs:
    """Valid update bodies, a few distinct ones per base version (encoding is the generator's cost)."""

    def __init__(self, shape: tuple[int, int]) -> None:
        self.shape = shape
        self.cache: dict[tuple[int, int], bytes] = {}

    def get(self, version: int, variant: int, num_samples: int) -> bytes:
        key = (version, variant)
        if key not in self.cache:
            rng = np.random.default_rng([version, variant])
            tensors = {"prompt_embeddings": (rng.standard_normal(self.shape) * 0.05).astype(np.float32)}
            meta = {
                "method": "prompt_tuning",
                "base_version": str(version),
                "num_samples": str(num_samples),
                "metrics": {"loss": 0.69, "last_loss": 0.68, "seconds": 1.0},
            }
            self.cache[key] = wire.encode(tensors, meta)
        return self.cache[key]


async def worker(
    i: int,
    http: aiohttp.ClientSession,
    args: argparse.Namespace,
    rec: Recorder,
    blobs: Blobs,
    stop: asyncio.Event,
) -> None:
    """One simulated worker from enrolment to 'done'."""
    fid, rnd = args.fid, random.Random(i)
    num_samples = 100 + (i % 7) * 10  # one weight per variant below: identical retries stay identical
    resp = await _request(
        rec,
        "enrol",
        http,
        "POST",
        f"{API}/{fid}/clients",
        json={"name": f"load-{i}", "num_samples": num_samples, "info": {}},
        headers={"Authorization": f"Bearer {args.enrol_token}"},
    )
    if resp is None:
        return
    auth = {"Authorization": f"Bearer {resp.json()['token']}"}
    if args.null:
        for r in range(1, args.rounds + 1):
            await _request(rec, "download", http, "GET", f"{API}/{fid}/prompts/{r - 1}", headers=auth)
            await asyncio.sleep(rnd.uniform(0, args.train_s))
            t = await _request(
                rec,
                "upload",
                http,
                "PUT",
                f"{API}/{fid}/rounds/{r}/update",
                data=blobs.get(r - 1, i % 7, num_samples),
                headers=auth,
            )
            if t is not None:
                rec.upload_times.append((r, time.time()))
        return
    have: str | None = None  # sha256 of the version last downloaded, as the agent keeps it

    async def fetch(version: int, sha: str) -> bool:
        nonlocal have
        if have == sha:
            return True
        resp = await _request(rec, "download", http, "GET", f"{API}/{fid}/prompts/{version}", headers=auth)
        if resp is not None:
            have = sha
        return resp is not None

    while not stop.is_set():
        resp = await _request(
            rec,
            "poll",
            http,
            "GET",
            f"{API}/{fid}/task",
            params={"wait": args.wait},
            headers=auth,
            timeout=aiohttp.ClientTimeout(total=args.wait + 120),
        )
        if resp is None:
            await asyncio.sleep(1.0)
            continue
        if resp.status_code == 204:
            continue
        task = resp.json()
        kind = task["kind"]
        if kind == "done":
            return
        rec.received.append((kind, int(task["round"] if kind == "train" else task["version"]), time.time()))
        if kind == "evaluate":
            v = int(task["version"])
            if await fetch(v, task["sha256"]):
                await _request(
                    rec,
                    "evaluation",
                    http,
                    "POST",
                    f"{API}/{fid}/rounds/{v}/evaluation",
                    headers=auth,
                    json={"num_samples": 50, "accuracy": 0.5 + (i % 10) / 100, "loss": 0.7},
                )
        elif kind == "train":
            v, number = int(task["version"]), int(task["round"])
            if await fetch(v, task["sha256"]):
                await asyncio.sleep(rnd.uniform(0, args.train_s))
                body = blobs.get(v, i % 7, num_samples)
                if await _request(
                    rec,
                    "upload",
                    http,
                    "PUT",
                    f"{API}/{fid}/rounds/{number}/update",
                    data=body,
                    headers={**auth, "Content-Type": "application/octet-stream"},
                ):
                    rec.upload_times.append((number, time.time()))


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """All workers; clients share a connection pool per group of 50 (a pool per process scales badly)."""
    rec = Recorder()
    blobs = Blobs((args.tokens, args.hidden))
    stop = asyncio.Event()
    # idle connections are dropped long before the coordinator closes them (FEDPROMPT_KEEP_ALIVE_S, 30 s)
    pools = [
        aiohttp.ClientSession(
            base_url=args.url,
            connector=aiohttp.TCPConnector(limit=60, keepalive_timeout=2.0),
            timeout=aiohttp.ClientTimeout(total=120.0),
        )
        for _ in range((args.clients + 49) // 50)
    ]
    t0 = time.time()
    tasks = [
        asyncio.create_task(worker(i, pools[i // 50], args, rec, blobs, stop)) for i in range(args.clients)
    ]
    done, pending = await asyncio.wait(tasks, timeout=args.time_limit)
    timed_out = len(pending)
    stop.set()
    for t in pending:
        t.cancel()
    for t in done:
        if t.exception() is not None:
            rec.error("generator", repr(t.exception()))
    for p in pools:
        await p.close()
    t1 = time.time()
    return {
        "started_at": t0,
        "finished_at": t1,
        "clients_unfinished": timed_out,
        "latencies": {k: v for k, v in rec.lat.items()},
        "errors": dict(rec.errors),
        "error_samples": rec.error_samples,
        "received": rec.received,
        "upload_times": rec.upload_times,
        "trace": rec.trace,
        "cpu_seconds": sum(os.times()[:2]),
    }


def main() -> None:
    """Parse options, run, write the JSON file."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--fid", type=int, default=1)
    ap.add_argument("--enrol-token", default="x")
    ap.add_argument("--clients", type=int, required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=20)
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--wait", type=float, default=20.0)
    ap.add_argument("--train-s", type=float, default=5.0)
    ap.add_argument("--time-limit", type=float, default=600.0)
    ap.add_argument("--null", action="store_true")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    # the same event loop as the coordinator's (uvloop where installed): the generator's own CPU
    # per request is part of every latency it measures, the null app's included
    try:
        import uvloop
    except ImportError:
        result = asyncio.run(run(args))
    else:
        result = uvloop.run(run(args))
    Path(args.out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
