"""Load generator: K simulated workers (asyncio + aiohttp) driving one coordinator through full rounds.

Run by ``bench.ingest`` as a separate process; writes one JSON file of latencies and counts.

Each simulated worker enrols with the enrolment token, then loops as the real agent does: long-poll
``GET …/task?wait=W``; for an *evaluate* task download the version and report an evaluation; for a
*train* task download the base version unless it is the version it last downloaded (the real agent
keeps that one, checked by its sha256), "train" for a random time in [0, train_s] (the spread of
real local training, compressed) and upload a valid safetensors update; stop at *done*. The null
app (``bench.null_server``) answers the same requests, so both are driven by the same code.

The generator's own limits go into the file: its CPU seconds, the lag of its event loop (a ticker
asks to wake every 10 ms and records how late it woke: every request's latency includes that
lateness), how long the K enrolments took (the ramp) and how many connections were opened and how
long opening them took.
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
from fedprompt.shared import wire

from bench.common import percentile

API = "/api/v1/federations"
TICK_S = 0.01


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


async def ticker(lags: list[float], stop: asyncio.Event, interval: float = TICK_S) -> None:
    """Wake every ``interval`` seconds and record how late each wake-up came (the loop's lag)."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        due = loop.time() + interval
        await asyncio.sleep(interval)
        lags.append(max(0.0, loop.time() - due))


def connection_trace(opened: list[float]) -> aiohttp.TraceConfig:
    """Seconds each new connection took to open (TCP connect, as the client sees it)."""
    trace = aiohttp.TraceConfig()

    async def start(session: Any, ctx: Any, params: Any) -> None:
        ctx.t0 = time.perf_counter()

    async def end(session: Any, ctx: Any, params: Any) -> None:
        opened.append(time.perf_counter() - ctx.t0)

    trace.on_connection_create_start.append(start)
    trace.on_connection_create_end.append(end)
    return trace


def _spread(values: list[float]) -> dict[str, Any]:
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
        "max": max(values, default=None),
    }


def generator_limits(
    lags: list[float], connects: list[float], enrolled: list[float], t0: float, cpu_s: float, wall_s: float
) -> dict[str, Any]:
    """The generator's own figures: CPU, loop lag, connection opening, enrolment ramp."""
    return {
        "cpu_s": cpu_s,
        "cpu_share": cpu_s / wall_s if wall_s > 0 else None,
        "loop_lag_s": _spread(lags),
        "connections": len(connects),
        "connect_s": _spread(connects),
        "ramp_s": (max(enrolled) - t0) if enrolled else None,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """All workers; clients share a connection pool per group of 50 (a pool per process scales badly).
    With several coordinator replicas (--url A,B,...) the groups are dealt to them in turn, as a load
    balancer that spreads connections would: a client's requests all reach one replica, and a change
    made through another (a round opened or closed there) reaches it through the database."""
    rec = Recorder()
    blobs = Blobs((args.tokens, args.hidden))
    stop = asyncio.Event()
    lags: list[float] = []
    connects: list[float] = []
    cpu0 = sum(os.times()[:2])
    # idle connections are dropped long before the coordinator closes them (FEDPROMPT_KEEP_ALIVE_S, 30 s)
    urls = [u for u in args.url.split(",") if u]
    pools = [
        aiohttp.ClientSession(
            base_url=urls[g % len(urls)],
            connector=aiohttp.TCPConnector(limit=60, keepalive_timeout=2.0),
            timeout=aiohttp.ClientTimeout(total=120.0),
            trace_configs=[connection_trace(connects)],
        )
        for g in range((args.clients + 49) // 50)
    ]
    t0 = time.time()
    tick = asyncio.create_task(ticker(lags, stop))
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
    await tick
    for p in pools:
        await p.close()
    t1 = time.time()
    cpu = sum(os.times()[:2])
    enrolled = [sent + dt for kind, sent, dt in rec.trace if kind == "enrol"]
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
        "cpu_seconds": cpu,
        "generator": {
            **generator_limits(lags, connects, enrolled, t0, cpu - cpu0, t1 - t0),
            "startup_cpu_s": cpu0,
        },
    }


def main() -> None:
    """Parse options, run, write the JSON file."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True, help="the coordinator, or its replicas comma-separated")
    ap.add_argument("--fid", type=int, default=1)
    ap.add_argument("--enrol-token", default="x")
    ap.add_argument("--clients", type=int, required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=20)
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--wait", type=float, default=20.0)
    ap.add_argument("--train-s", type=float, default=5.0)
    ap.add_argument("--time-limit", type=float, default=600.0)
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
