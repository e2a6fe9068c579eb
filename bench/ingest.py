"""Coordinator ingest: K simulated workers through full rounds, SQLite and Postgres, vs a null FastAPI app.

    python -m bench.ingest [--quick] [--backends sqlite,postgres] [--grid 100x0.1,1000x1.0,...] [--repeats 3]

For each (K, C, prompt size) the null app and every backend run in ``--repeats`` rounds, the order
rotating from one repeat to the next (null, sqlite, postgres; sqlite, postgres, null; ...), so a
burst of load from other jobs hits the baseline as often as the coordinator. Each backend run is a
fresh coordinator process (``fedprompt-coordinator serve`` on a loopback port; SQLite file, or a
database created on the local Postgres and dropped after) with a federation of ``--rounds`` rounds;
``bench.loadgen`` in a separate process enrols K workers that long-poll, download, "train" (a random
pause in [0, --train-s]) and upload, and evaluate each new version, as real workers do. The null app
(``bench.null_server``) answers the same requests from memory and does nothing else.

Every run is recorded: rounds per minute, uploads per second, p50/p99 latency of uploads, downloads,
evaluations, enrolments and of task delivery (a train task's arrival after its round opened, an
evaluate task's after the version was made), errors, server CPU seconds and peak RSS, the load
generator's own limits (CPU seconds, event-loop lag, connections opened, enrolment ramp, start-up)
and the machine's load average at the start and end. Each backend's figures are also divided by
the null app's of the same repeat; ``summary`` holds min / median / max over the repeats of every
figure and ratio.

The full grid takes hours on 2 cores; ``--quick`` (K ∈ {100, 1,000}, 20×384 only) is the shorter pass.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from fedprompt.coordinator.config import Settings
from fedprompt.shared.client import CoordinatorClient
from fedprompt.shared.local import free_port, wait_ready
from fedprompt.shared.spec import FederationSpec

from bench.common import percentile, proc_cpu_seconds, proc_peak_rss_mib, ratio, spread, write_result

ADMIN = "bench-admin-token-0123456789abcdef"
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/test"
FULL_GRID = [(100, 0.1), (100, 1.0), (1000, 0.1), (1000, 1.0), (5000, 0.1), (5000, 1.0)]
QUICK_GRID = [(100, 0.1), (100, 1.0), (1000, 1.0)]
PROMPT_TOKENS = 20  # the load generator's prompt: 20 virtual tokens of the --hidden width
DEFAULT_MAX_CONNECTIONS: int = Settings.model_fields["max_connections"].default  # FEDPROMPT_MAX_CONNECTIONS
# FEDPROMPT_MAX_UPLOAD_BYTES_IN_FLIGHT
DEFAULT_UPLOAD_BYTES_IN_FLIGHT: int = Settings.model_fields["max_upload_bytes_in_flight"].default
ENV = {
    "FEDPROMPT_ADMIN_TOKEN": ADMIN,
    "FEDPROMPT_SWEEP_INTERVAL_S": "1",
    # every simulated worker enrols from 127.0.0.1: the per-IP enrolment limit would refuse most of them
    "FEDPROMPT_ENROLMENT_RATE_LIMIT": "1000000/minute",
}


def _stats(values: list[float]) -> dict[str, Any]:
    return {"n": len(values), "p50": percentile(values, 50), "p99": percentile(values, 99)}


def _loadgen(url: str, out: Path, k: int, hidden: int, args: argparse.Namespace, **extra: Any) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "bench.loadgen",
        "--url",
        url,
        "--clients",
        str(k),
        "--rounds",
        str(args.rounds),
        "--tokens",
        str(PROMPT_TOKENS),
        "--hidden",
        str(hidden),
        "--train-s",
        str(args.train_s),
        "--wait",
        str(args.wait),
        "--time-limit",
        str(args.time_limit),
        "--out",
        str(out),
    ]
    for key, value in extra.items():
        cmd += [f"--{key.replace('_', '-')}"] + ([] if value is True else [str(value)])
    launched = time.time()
    subprocess.run(cmd, check=True, timeout=args.time_limit + 120)
    return {**json.loads(out.read_text()), "launched_at": launched}


def _timeline(
    trace: list[list[Any]], opened: dict[int, float], made: dict[int, float]
) -> list[dict[str, Any]]:
    """Per second after each round opened: requests sent by kind and the worst upload latency."""
    out = []
    for number, start in sorted(opened.items()):
        end = made.get(number, float("inf"))
        per_s: dict[int, dict[str, Any]] = defaultdict(lambda: defaultdict(int))
        for kind, sent, dt in trace:
            if start <= sent < end:
                cell = per_s[int(sent - start)]
                cell[kind] += 1
                if kind == "upload":
                    cell["upload_max_s"] = max(cell["upload_max_s"], round(dt, 3))
        out.append({"round": number, "seconds": {s: dict(v) for s, v in sorted(per_s.items())}})
    return out


def _upload_rate(upload_times: list[list[float]]) -> float | None:
    """Uploads per second within each round's upload window, averaged over rounds (weighted by uploads)."""
    per_round: dict[int, list[float]] = defaultdict(list)
    for number, t in upload_times:
        per_round[int(number)].append(t)
    spans = [(len(ts), max(ts) - min(ts)) for ts in per_round.values() if len(ts) > 1]
    total = sum(n for n, _ in spans)
    span = sum(s for _, s in spans)
    return total / span if span > 0 else None


class Postgres:
    """A fresh database on the local server, dropped afterwards."""

    def __enter__(self) -> str:
        import psycopg

        self.name = f"fedprompt_bench_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.name}"')
        return f"postgresql+psycopg://postgres@127.0.0.1:5432/{self.name}"

    def __exit__(self, *exc: object) -> None:
        import psycopg

        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


def analyse(load: dict[str, Any], history: list[dict[str, Any]]) -> dict[str, Any]:
    """What the coordinator and the null app are both measured by: latencies, task delivery, errors,
    the generator's own limits."""
    closed = [r for r in history if r["state"] == "closed"]
    opened = {r["round"]: r["opened_at"] for r in history}  # latest attempt wins
    made = {r["result_version"]: r["closed_at"] for r in closed}
    delivery: dict[str, list[float]] = {"train": [], "evaluate": []}
    for kind, number, t in load["received"]:
        start = opened.get(number) if kind == "train" else made.get(number)
        if start is not None:
            delivery[kind].append(t - start)
    span = (max(r["closed_at"] for r in closed) - min(r["opened_at"] for r in history)) if closed else None
    lat = load["latencies"]
    return {
        "rounds_closed": len(closed),
        "rounds_failed": sum(r["state"] == "failed" for r in history),
        "rounds_per_min": (len(closed) / span * 60) if span else None,
        "uploads": len(lat.get("upload", [])),
        "uploads_per_s": _upload_rate(load["upload_times"]),
        "upload_s": _stats(lat.get("upload", [])),
        "download_s": _stats(lat.get("download", [])),
        "evaluation_s": _stats(lat.get("evaluation", [])),
        "enrol_s": _stats(lat.get("enrol", [])),
        "poll_delivery_s": _stats(delivery["train"] + delivery["evaluate"]),
        "train_delivery_s": _stats(delivery["train"]),
        "evaluate_delivery_s": _stats(delivery["evaluate"]),
        "polls": len(lat.get("poll", [])),
        "requests": sum(
            len(v) for v in lat.values()
        ),  # every kind: enrol, poll, download, evaluation, upload
        "errors": sum(load["errors"].values()),
        "error_kinds": load["errors"],
        "error_samples": load["error_samples"],
        "clients_unfinished": load["clients_unfinished"],
        "loadgen_cpu_s": load["cpu_seconds"],
        "generator": {**load.get("generator", {}), "startup_s": load["started_at"] - load["launched_at"]},
        "timeline": _timeline(load["trace"], opened, made),
    }


def run_coordinator(name: str, k: int, c: float, hidden: int, args: argparse.Namespace) -> dict[str, Any]:
    """One federation of K simulated workers against a real coordinator process: `name` is a backend,
    with ``@previous`` the coordinator of the --previous source tree (same interpreter and packages)."""
    from tests.helpers import coordinator_process  # the launcher the end-to-end tests use

    backend, _, build = name.partition("@")
    env = {**ENV, "PYTHONPATH": str(Path(args.previous).resolve())} if build == "previous" else ENV
    replicas = args.replicas if backend == "postgres" else 1  # SQLite: one process, no replicas
    # every simulated worker holds a connection (its long-poll): past FEDPROMPT_MAX_CONNECTIONS open
    # connections a replica answers 503 to enrolments, so raise it as an operator of such a fleet would
    max_connections = max(DEFAULT_MAX_CONNECTIONS, k + 1000)
    # and every selected worker may upload at once: past FEDPROMPT_MAX_UPLOAD_BYTES_IN_FLIGHT a
    # replica answers 429 (retried after Retry-After), so hold room for all of a round's uploads
    in_flight = max(DEFAULT_UPLOAD_BYTES_IN_FLIGHT, math.ceil(k * c) * (PROMPT_TOKENS * hidden * 4 + 4096))
    env = {
        **env,
        "FEDPROMPT_MAX_CONNECTIONS": str(max_connections),
        "FEDPROMPT_MAX_UPLOAD_BYTES_IN_FLIGHT": str(in_flight),
    }

    with tempfile.TemporaryDirectory(prefix="fedprompt-ingest-") as tmp:
        tmpdir = Path(tmp)
        db_ctx = Postgres() if backend == "postgres" else None
        db = db_ctx.__enter__() if db_ctx else f"sqlite:///{tmpdir / 'coordinator.db'}"
        try:
            with contextlib.ExitStack() as stack:
                # the replicas one after another: each applies the migrations before it answers
                started = [
                    stack.enter_context(coordinator_process(db, _folder(tmpdir, r), extra_env=env))
                    for r in range(replicas)
                ]
                urls, procs = [u for u, _ in started], [p for _, p in started]
                admin = CoordinatorClient(urls[0], ADMIN, timeout=600.0)  # history of 1,000s of participants
                spec = FederationSpec(
                    name=f"ingest-{k}-{c}",
                    hidden_size=hidden,
                    fraction=c,
                    min_clients=1,
                    quorum=1,
                    expected_clients=k,
                    rounds=args.rounds,
                    round_deadline_s=3600,
                    availability_timeout_s=3600,
                    local_steps=1,
                )
                fid = admin.create_federation(spec.model_dump(mode="json")).id
                token = admin.create_enrollment_token(fid, max_uses=k)
                cpu0 = [proc_cpu_seconds(p.pid) for p in procs]
                t0 = time.time()
                spy = _profiler(procs[0].pid, args, f"{name.replace('@', '-')}-{k}-{c}-{hidden}")
                load = _loadgen(
                    ",".join(urls), tmpdir / "load.json", k, hidden, args, fid=fid, enrol_token=token
                )
                profile = _stop_profiler(spy)
                wall = time.time() - t0
                cpu = sum(proc_cpu_seconds(p.pid) - c0 for p, c0 in zip(procs, cpu0, strict=True))
                peaks = [proc_peak_rss_mib(p.pid) for p in procs]
                history = admin.rounds(fid)
                latest = admin.federation(fid).latest_version
                admin.close()
        finally:
            if db_ctx:
                db_ctx.__exit__(None, None, None)
    analysed = analyse(load, history)
    return {
        "backend": backend,
        "build": build or "this",
        "k": k,
        "c": c,
        "prompt": [PROMPT_TOKENS, hidden],
        **analysed,
        "replicas": replicas,
        "max_connections": max_connections,
        "max_upload_bytes_in_flight": in_flight,
        "closed_once": closed_once(history, args.rounds, latest),
        "coordinator_cpu_s": cpu,  # all replicas together
        "cpu_ms_per_request": 1000 * cpu / max(analysed["requests"], 1),
        "coordinator_peak_rss_mib": max(peaks),
        "replica_peak_rss_mib": peaks,
        "wall_s": wall,
        **({"profile": profile} if profile else {}),
    }


def _folder(parent: Path, replica: int) -> Path:
    """A replica's own data folder (its log, its files) under the run's temporary folder."""
    path = parent / f"replica-{replica}"
    path.mkdir()
    return path


def closed_once(history: list[dict[str, Any]], rounds: int, latest: int) -> bool:
    """Whether each round 1..rounds was closed by exactly one attempt and the latest version is the
    last round's: with several replicas, no round was aggregated twice and none was lost."""
    closed = Counter(r["round"] for r in history if r["state"] == "closed")
    return closed == Counter(range(1, rounds + 1)) and latest == rounds


def run_null(k: int, c: float, hidden: int, args: argparse.Namespace) -> dict[str, Any]:
    """The same K, C, pacing and rounds against the null FastAPI app."""
    port = free_port()
    cmd = [sys.executable, "-m", "bench.null_server", "--port", str(port), "--hidden", str(hidden)]
    cmd += ["--clients", str(k), "--rounds", str(args.rounds), "--fraction", str(c)]
    proc = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, 60)
        cpu0 = proc_cpu_seconds(proc.pid)
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.time()
            load = _loadgen(url, Path(tmp) / "null.json", k, hidden, args)
            wall = time.time() - t0
        cpu = proc_cpu_seconds(proc.pid) - cpu0
        peak = proc_peak_rss_mib(proc.pid)
        with urllib.request.urlopen(f"{url}/api/v1/federations/1/rounds", timeout=30) as resp:
            history = json.loads(resp.read())
    finally:
        proc.terminate()
        proc.wait(10)
    analysed = analyse(load, history)
    return {
        "k": k,
        "c": c,
        "hidden": hidden,
        "prompt": [PROMPT_TOKENS, hidden],
        **analysed,
        "cpu_s": cpu,
        "cpu_ms_per_request": 1000 * cpu / max(analysed["requests"], 1),
        "peak_rss_mib": peak,
        "wall_s": wall,
    }


def compare(row: dict[str, Any], null: dict[str, Any]) -> dict[str, Any]:
    """The coordinator's figures as ratios to the null app's (of the same repeat)."""
    per_upload = ratio(
        row["coordinator_cpu_s"] / max(row["uploads"], 1), null["cpu_s"] / max(null["uploads"], 1)
    )
    return {
        "upload_p50": ratio(row["upload_s"]["p50"], null["upload_s"]["p50"]),
        "upload_p99": ratio(row["upload_s"]["p99"], null["upload_s"]["p99"]),
        "poll_delivery_p99": ratio(row["poll_delivery_s"]["p99"], null["poll_delivery_s"]["p99"]),
        "train_delivery_p99": ratio(row["train_delivery_s"]["p99"], null["train_delivery_s"]["p99"]),
        "download_p99": ratio(row["download_s"]["p99"], null["download_s"]["p99"]),
        "uploads_per_s": ratio(row["uploads_per_s"], null["uploads_per_s"]),
        "cpu_per_upload": per_upload,
        "peak_rss": ratio(row["coordinator_peak_rss_mib"], null["peak_rss_mib"]),
    }


def compare_builds(row: dict[str, Any], previous: dict[str, Any]) -> dict[str, Any]:
    """This build's figures as ratios to the previous build's (same backend, same repeat): below 1 is
    less CPU or a shorter wait, above 1 more rounds or uploads a second."""
    return {
        "cpu_ms_per_request": ratio(row["cpu_ms_per_request"], previous["cpu_ms_per_request"]),
        "train_delivery_p99": ratio(row["train_delivery_s"]["p99"], previous["train_delivery_s"]["p99"]),
        "poll_delivery_p99": ratio(row["poll_delivery_s"]["p99"], previous["poll_delivery_s"]["p99"]),
        "upload_p99": ratio(row["upload_s"]["p99"], previous["upload_s"]["p99"]),
        "rounds_per_min": ratio(row["rounds_per_min"], previous["rounds_per_min"]),
        "uploads_per_s": ratio(row["uploads_per_s"], previous["uploads_per_s"]),
    }


def rotation(systems: list[str], repeat: int) -> list[str]:
    """The order of one repeat: the list rotated by the repeat's number, so each system goes first in turn."""
    shift = repeat % len(systems)
    return systems[shift:] + systems[:shift]


FIGURES: dict[str, tuple[str | int, ...]] = {
    "upload_p50": ("upload_s", "p50"),
    "upload_p99": ("upload_s", "p99"),
    "poll_delivery_p50": ("poll_delivery_s", "p50"),
    "poll_delivery_p99": ("poll_delivery_s", "p99"),
    "train_delivery_p99": ("train_delivery_s", "p99"),
    "download_p99": ("download_s", "p99"),
    "uploads_per_s": ("uploads_per_s",),
    "errors": ("errors",),
    "cpu_s": ("cpu_s",),
    "cpu_ms_per_request": ("cpu_ms_per_request",),
    "requests": ("requests",),
    "peak_rss_mib": ("peak_rss_mib",),
    "rounds_per_min": ("rounds_per_min",),
    "generator_cpu_s": ("generator", "cpu_s"),
    "generator_lag_p99": ("generator", "loop_lag_s", "p99"),
    "generator_ramp_s": ("generator", "ramp_s"),
    "generator_startup_s": ("generator", "startup_s"),
    "loadavg_start": ("loadavg_start", 0),
    "loadavg_end": ("loadavg_end", 0),
}
ALIASES = {"cpu_s": "coordinator_cpu_s", "peak_rss_mib": "coordinator_peak_rss_mib"}


def _get(run: dict[str, Any], path: tuple[str | int, ...]) -> Any:
    value: Any = run
    for i, key in enumerate(path):
        if i == 0 and key in ALIASES and key not in value:
            key = ALIASES[key]
        try:
            value = value[key]
        except (KeyError, IndexError, TypeError):
            return None
    return value


def summarize(repeats: list[dict[str, Any]]) -> dict[str, Any]:
    """Min / median / max over the repeats of every figure of every system, and of every ratio to the
    null app of the same repeat."""
    systems = list(repeats[0]["runs"]) if repeats else []
    out: dict[str, Any] = {}
    for name in systems:
        runs = [r["runs"][name] for r in repeats]
        cell = {f: spread([_get(run, path) for run in runs]) for f, path in FIGURES.items()}
        for against in ("vs_null", "vs_previous"):
            keys = runs[0].get(against, {})
            if keys:
                cell[against] = {key: spread([run[against].get(key) for run in runs]) for key in keys}
        out[name] = cell
    return out


def run_point(k: int, c: float, hidden: int, backends: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """The null app and every backend at one (K, C, width), in ``--repeats`` rounds with the order rotating."""
    repeats = []
    for number in range(args.repeats):
        systems = [*backends, *(f"{b}@previous" for b in backends if args.previous)]
        order = rotation(["null", *systems], number)
        runs: dict[str, dict[str, Any]] = {}
        for name in order:
            load0 = list(os.getloadavg())
            run = (
                run_null(k, c, hidden, args) if name == "null" else run_coordinator(name, k, c, hidden, args)
            )
            run.update(repeat=number, loadavg_start=load0, loadavg_end=list(os.getloadavg()))
            runs[name] = run
            _print_run(name, run)
        for name in backends:
            runs[name]["vs_null"] = compare(runs[name], runs["null"])
            if f"{name}@previous" in runs:
                runs[name]["vs_previous"] = compare_builds(runs[name], runs[f"{name}@previous"])
        repeats.append({"repeat": number, "order": order, "runs": {n: runs[n] for n in ["null", *systems]}})
    return {"k": k, "c": c, "hidden": hidden, "repeats": repeats, "summary": summarize(repeats)}


def _print_run(name: str, row: dict[str, Any]) -> None:
    gen = row["generator"]
    replicas = row.get("replicas", 1)
    shared = f"{replicas} replicas, each round closed once: {row['closed_once']}, " if replicas > 1 else ""
    print(
        f"[{row['repeat']}] {name} K={row['k']} C={row['c']} 20x{row['prompt'][1]}: {row['uploads']} uploads, "
        f"{row['uploads_per_s'] or 0:.0f}/s, upload p50/p99 {row['upload_s']['p50'] or 0:.3f}/"
        f"{row['upload_s']['p99'] or 0:.3f} s, poll delivery p99 {row['poll_delivery_s']['p99'] or 0:.3f} s, "
        f"cpu {row['cpu_ms_per_request']:.2f} ms/request, errors {row['errors']}, {shared}"
        f"generator cpu {gen.get('cpu_s') or 0:.1f} s, "
        f"lag p99 {(gen.get('loop_lag_s') or {}).get('p99') or 0:.3f} s, "
        f"load {row['loadavg_start'][0]:.1f} -> {row['loadavg_end'][0]:.1f}",
        flush=True,
    )


def _profiler(pid: int, args: argparse.Namespace, label: str) -> tuple[subprocess.Popen, Path] | None:
    """py-spy sampling the coordinator while the load runs (--profile DIR), collapsed stacks."""
    if not args.profile:
        return None
    out = Path(args.profile) / f"coordinator-{label}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [str(Path(sys.executable).parent / "py-spy"), "record", "-p", str(pid), "-r", "200"]
    # --gil: only the thread holding the interpreter lock, i.e. where the coordinator's CPU goes
    cmd += ["--format", "raw", "--nonblocking", "--gil", "-o", str(out)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), out


def _stop_profiler(spy: tuple[subprocess.Popen, Path] | None) -> dict[str, Any] | None:
    if spy is None:
        return None
    proc, out = spy
    proc.send_signal(2)  # SIGINT: py-spy writes its file and exits
    proc.wait(60)
    return {"file": str(out), "top": summarize_profile(out)}


def summarize_profile(path: Path, top: int = 15) -> list[dict[str, Any]]:
    """Share of samples in which each project function is on the stack (inclusive), highest first."""
    counts: dict[str, int] = defaultdict(int)
    total = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        total += int(n)
        seen = set()
        for frame in stack.split(";"):
            func, _, where = frame.partition(" (")
            if where.startswith(("coordinator/", "shared/")):
                name = f"{func} ({where.split(':')[0]})"
                if name not in seen:
                    seen.add(name)
                    counts[name] += int(n)
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])[:top]
    return [{"function": f, "share": c / total} for f, c in ranked] if total else []


def _describe_tree(path: str) -> dict[str, Any]:
    """The --previous tree: where, and its commit."""
    commit = subprocess.run(
        ["git", "-C", path, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return {"path": str(Path(path).resolve()), "commit": commit or None}


def _parse_grid(text: str) -> list[tuple[int, float]]:
    return [(int(k), float(c)) for k, c in (item.split("x") for item in text.split(","))]


def _backends(text: str) -> list[str]:
    """The coordinator's backends to run; ``null`` is accepted and dropped (the null app runs in every repeat)."""
    names = [b for b in text.split(",") if b and b != "null"]
    unknown = sorted(set(names) - {"sqlite", "postgres"})
    if unknown:
        raise SystemExit(f"--backends takes sqlite and postgres, not {', '.join(unknown)}")
    return names


def main(argv: list[str] | None = None) -> None:
    """Run the grid and write bench/results/ingest.json."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="K <= 1000 and 20x384 only")
    ap.add_argument("--grid", default=None, help="e.g. 100x0.1,1000x1.0 (K x C)")
    ap.add_argument("--hidden", default=None, help="prompt widths, e.g. 384,768")
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument("--repeats", type=int, default=3, help="rounds of (null app, backends) per grid point")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--train-s", type=float, default=5.0, help="local training time, uniform in [0, this]")
    ap.add_argument("--wait", type=float, default=20.0, help="long-poll wait of the workers")
    ap.add_argument("--time-limit", type=float, default=600.0, help="bound on one load generator run")
    ap.add_argument("--profile", default=None, help="directory: sample the coordinator with py-spy")
    ap.add_argument(
        "--previous",
        default=None,
        help="source tree of the previous build (e.g. a git worktree): its coordinator runs beside this one's",
    )
    ap.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="coordinator processes behind the one Postgres database (SQLite runs stay one process)",
    )
    ap.add_argument("--name", default="ingest")
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args(argv)
    backends = _backends(args.backends)
    grid = _parse_grid(args.grid) if args.grid else (QUICK_GRID if args.quick else FULL_GRID)
    hiddens = [int(h) for h in (args.hidden or ("384" if args.quick else "384,768")).split(",")]
    points = []
    for hidden in hiddens:
        # 20x768 only changes the bytes per request: one (K, C) point is enough to show it
        at = grid if hidden == hiddens[0] else [p for p in grid if p == (1000, 1.0)] or grid[-1:]
        for k, c in at:
            points.append(run_point(k, c, hidden, backends, args))
    path = write_result(
        args.name,
        {
            "settings": {
                "rounds": args.rounds,
                "train_s": args.train_s,
                "wait": args.wait,
                "quick": args.quick,
                "repeats": args.repeats,
                "backends": backends,
                "replicas": args.replicas,
                "previous": _describe_tree(args.previous) if args.previous else None,
            },
            "points": points,
        },
        out_dir=Path(args.out_dir) if args.out_dir else None,
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
