"""Secure aggregation's cost: bytes per client and round wall time, against plain FedAvg in the same run.

    python -m bench.secagg [--k 10,100,1000] [--repeats 3] [--threads 8]

For each K and repeat a fresh ``fedprompt-coordinator serve`` (SQLite, loopback) holds two
federations of one round each, with the same K clients' worth of enrolments: plain FedAvg and secure
aggregation (the spec's defaults: k from shared/secagg/graph.py's bound). Simulated clients (a
thread pool in this process, over HTTP) answer their tasks as workers do, without training: plain
clients download the prompt and upload a random update; secure clients answer every stage through
the worker's own secure stages (worker/secagg.py, every check an honest client makes, its state in a
temporary folder): signed keys, envelopes, a masked vector, the survivor set's signature, unmasking. Each client counts the bytes it sent (request bodies) and received (response
bodies: tasks with their keys and envelopes, the prompt); a round's wall time runs from the first
task poll to the version's existence. ``client_crypto_s`` is the CPU the simulated clients spent in
the protocol's own work (keys, Shamir sharing, envelopes, masks), which real clients spend on their
own machines in parallel; ``coordinator_cpu_s`` is the coordinator process's CPU over the round.
The plain and secure rounds of one run alternate order from run to run. Each K's entry holds every
repeat and the median of each figure and of each secure ÷ plain ratio (ratios within a repeat).

    python -m bench.secagg --compare PLAIN_OUT SECURE_OUT

writes ``secagg-sst2.json`` from two ``fedprompt simulate`` folders of the same options and seed,
one with ``--secure-aggregation``: their accuracy per round, wall times, and the largest difference
between their prompt versions, element by element, against the quantisation bound.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from fedprompt.shared import wire
from fedprompt.shared.local import free_port, wait_ready
from fedprompt.shared.secagg import quantise
from fedprompt.shared.secagg.client import Policy
from fedprompt.shared.spec import FederationSpec
from fedprompt.worker.secagg import SecureStages
from sqlalchemy import create_engine, text

from bench.common import proc_cpu_seconds, ratio, write_result

ADMIN = "bench-admin-token-0123456789abcdef"
API = "/api/v1/federations"


class SimClient:
    """One simulated client: its token, its counters, and its round secrets when secure."""

    def __init__(
        self,
        fid: int,
        enrolled: dict[str, Any],
        size: int,
        rng: np.random.Generator,
        state: Path,
        policy: Policy | None,
    ) -> None:
        self.fid, self.headers = fid, {"Authorization": f"Bearer {enrolled['token']}"}
        self.update = rng.uniform(-0.01, 0.01, size)
        self.up = self.down = 0
        self.crypto_s = 0.0
        self.stages = SecureStages(state, fid, enrolled["client_id"], policy) if policy is not None else None
        self.lock = threading.Lock()

    def step(self, http: httpx.Client, shapes: dict[str, tuple[int, ...]]) -> bool:
        """Answer the current task once; False when there was none."""
        with self.lock:
            resp = http.get(f"{API}/{self.fid}/task", headers=self.headers)
            self.down += len(resp.content)
            if resp.status_code == 204:
                return False
            task = resp.json()
            if task["kind"] == "secagg":
                started = time.process_time()
                assert self.stages is not None
                payload = self.stages.answer(task)
                self.crypto_s += time.process_time() - started
                sent = http.post(
                    f"{API}/{self.fid}/rounds/{task['round']}/secagg/{task['stage']}",
                    json=payload,
                    headers=self.headers,
                )
                self.up += len(sent.request.content)
                self.down += len(sent.content)
                return True
            if task["kind"] == "evaluate":  # version 0, before the round: a report, as workers send
                report = {"num_samples": 10, "accuracy": 0.5}
                sent = http.post(
                    f"{API}/{self.fid}/rounds/{task['version']}/evaluation", json=report, headers=self.headers
                )
                self.up += len(sent.request.content)
                return True
            if task["kind"] != "train":
                return False
            prompt = http.get(f"{API}/{self.fid}/prompts/{task['version']}", headers=self.headers)
            self.down += len(prompt.content)
            if "secure_aggregation" in task:
                started = time.process_time()
                assert self.stages is not None
                body = self.stages.masked(task, self.update, 10, {"loss": 0.5})
                self.crypto_s += time.process_time() - started
            else:
                base = wire.decode(prompt.content)[0]
                flat = np.concatenate([base[n].ravel() for n in shapes]) + self.update
                tensors, start = {}, 0
                for name, shape in shapes.items():
                    n = int(np.prod(shape))
                    tensors[name] = flat[start : start + n].reshape(shape).astype(np.float32)
                    start += n
                body = wire.encode(tensors, {"num_samples": "10", "base_version": str(task["version"])})
            sent = http.put(
                f"{API}/{self.fid}/rounds/{task['round']}/update", content=body, headers=self.headers
            )
            self.up += len(body)
            self.down += len(sent.content)
            return True


def _spec(k: int, secure: bool, tokens: int, hidden: int) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": f"{'secure' if secure else 'plain'}-{k}",
        "num_virtual_tokens": tokens,
        "hidden_size": hidden,
        "rounds": 1,
        "fraction": 1.0,
        "min_clients": k,
        "quorum": 1,
        "round_deadline_s": 3600,
        "availability_timeout_s": 3600,
        "eval_every": 100000,
    }
    if secure:
        spec["secure_aggregation"] = {"stage_deadline_s": 3600}
    return spec


def _round(
    http: httpx.Client, pid: int, k: int, secure: bool, tokens: int, hidden: int, threads: int, tmp: Path
) -> dict[str, Any]:
    admin = {"Authorization": f"Bearer {ADMIN}"}
    spec = _spec(k, secure, tokens, hidden)
    fid = http.post(API, json=spec, headers=admin).json()["id"]
    enrol = http.post(f"{API}/{fid}/enrollment-tokens", json={"max_uses": k}, headers=admin).json()["token"]
    rng = np.random.default_rng(k)
    size = tokens * hidden
    policy = Policy.from_spec(FederationSpec.model_validate(spec)) if secure else None
    clients = [
        SimClient(
            fid,
            http.post(
                f"{API}/{fid}/clients",
                json={"name": f"c{i}", "num_samples": 10},
                headers={"Authorization": f"Bearer {enrol}"},
            ).json(),
            size,
            rng,
            tmp / f"{fid}-{i}",
            policy,
        )
        for i in range(k)
    ]
    shapes = {"prompt_embeddings": (tokens, hidden)}
    cpu0, started = proc_cpu_seconds(pid), time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        while http.get(f"{API}/{fid}", headers=admin).json()["latest_version"] < 1:
            if not any(list(pool.map(lambda c: c.step(http, shapes), clients))):
                time.sleep(0.05)
    wall = time.perf_counter() - started
    cpu = proc_cpu_seconds(pid) - cpu0
    stats = http.get(f"{API}/{fid}/rounds/1", headers=admin).json()["stats"]
    return {
        "wall_s": wall,
        "coordinator_cpu_s": cpu,
        "client_crypto_s": sum(c.crypto_s for c in clients),
        "bytes_up_per_client": sum(c.up for c in clients) / k,
        "bytes_down_per_client": sum(c.down for c in clients) / k,
        "aggregation_s": stats.get("aggregation_s"),
        "k_neighbours": (stats.get("secure_aggregation") or {}).get("k"),
        "t": (stats.get("secure_aggregation") or {}).get("t"),
        "stage_bytes_up": (stats.get("secure_aggregation") or {}).get("bytes_up"),
    }


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(np.median(present)) if present else None


def run(ks: list[int], tokens: int, hidden: int, threads: int, repeats: int = 3) -> dict[str, Any]:
    """Plain and secure rounds at each K, `repeats` times; the secure figures also as ratios to the
    plain ones of the same repeat, and the median of each over the repeats."""
    out: dict[str, Any] = {"prompt": [tokens, hidden], "repeats": repeats, "runs": []}
    n = 0
    for k in ks:
        repeated = [
            _one(k, tokens, hidden, threads, order_first_plain=(n + r) % 2 == 0) for r in range(repeats)
        ]
        n += repeats
        figures = (
            "wall_s",
            "coordinator_cpu_s",
            "client_crypto_s",
            "bytes_up_per_client",
            "bytes_down_per_client",
        )
        entry: dict[str, Any] = {
            "k": k,
            "repeats": repeated,
            "plain": {f: _median([r["plain"][f] for r in repeated]) for f in figures},
            "secure": {
                **{f: _median([r["secure"][f] for r in repeated]) for f in figures},
                **{f: repeated[0]["secure"][f] for f in ("k_neighbours", "t", "stage_bytes_up")},
            },
            "secure_over_plain": {
                key: _median([r["secure_over_plain"][key] for r in repeated])
                for key in repeated[0]["secure_over_plain"]
            },
        }
        out["runs"].append(entry)
        plain, secure = entry["plain"], entry["secure"]
        print(
            f"K={k} (median of {repeats}): wall {plain['wall_s']:.2f} s plain, {secure['wall_s']:.2f} s secure; "
            f"up/client {plain['bytes_up_per_client']:.0f} / {secure['bytes_up_per_client']:.0f} B; down/client "
            f"{plain['bytes_down_per_client']:.0f} / {secure['bytes_down_per_client']:.0f} B",
            flush=True,
        )
    return out


def _one(k: int, tokens: int, hidden: int, threads: int, *, order_first_plain: bool) -> dict[str, Any]:
    """One plain and one secure round of K clients on a fresh coordinator."""
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        env = {
            **os.environ,
            "FEDPROMPT_DATABASE_URL": f"sqlite:///{tmp}/bench.db",
            "FEDPROMPT_ADMIN_TOKEN": ADMIN,
            "FEDPROMPT_DATA_DIR": tmp,
            "FEDPROMPT_RATE_LIMITS": "false",
            "FEDPROMPT_SWEEP_INTERVAL_S": "0.2",
        }
        exe = str(Path(sys.executable).parent / "fedprompt-coordinator")
        proc = subprocess.Popen(
            [exe, "serve", "--port", str(port), "--log-level", "warning"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            wait_ready(url, 60.0, lambda: None)
            limits = httpx.Limits(max_connections=threads * 2)
            with httpx.Client(base_url=url, timeout=120, limits=limits) as http:
                order = [False, True] if order_first_plain else [True, False]
                rounds = {s: _round(http, proc.pid, k, s, tokens, hidden, threads, Path(tmp)) for s in order}
        finally:
            proc.terminate()
            proc.wait(30)
        plain, secure = rounds[False], rounds[True]
        ratios = {
            key: ratio(secure[key], plain[key])
            for key in ("wall_s", "coordinator_cpu_s", "bytes_up_per_client", "bytes_down_per_client")
        }
        return {"plain": plain, "secure": secure, "secure_over_plain": ratios}


def _versions(out: Path) -> dict[int, np.ndarray]:
    engine = create_engine(f"sqlite:///{out / 'fedprompt.db'}")
    with engine.connect() as c:
        rows = c.execute(text("SELECT version, blob FROM prompt_versions ORDER BY version")).all()
    engine.dispose()
    return {int(v): np.concatenate([t.ravel() for t in wire.decode(b)[0].values()]) for v, b in rows}


def compare(plain_out: Path, secure_out: Path) -> dict[str, Any]:
    """Accuracy, wall time and prompt differences of a plain and a secure simulation of one seed."""
    runs = {
        name: json.loads((out / "results.json").read_text())
        for name, out in (("plain", plain_out), ("secure", secure_out))
    }
    plain_v, secure_v = _versions(plain_out), _versions(secure_out)
    sa = runs["secure"]["spec"]["secure_aggregation"]
    return {
        name: {
            "accuracy": [r["accuracy"] for r in run["rounds"]],
            "initial_accuracy": run["initial_accuracy"],
            "final_accuracy": run["final_accuracy"],
            "wall_seconds": run["wall_seconds"],
            "bytes_up": run["total_bytes_up"],
        }
        for name, run in runs.items()
    } | {
        "options": {
            k: runs["secure"]["spec"][k] for k in ("rounds", "local_steps", "lr", "seed", "fraction")
        },
        "clients": runs["secure"]["clients"],
        "secure_aggregation": sa,
        "error_bound": quantise.error_bound(sa["clip"], sa["bits"]),
        "max_abs_prompt_difference": {
            str(v): float(np.abs(plain_v[v].astype(np.float64) - secure_v[v]).max())
            for v in sorted(plain_v)
            if v in secure_v
        },
        "final_accuracy_difference": runs["secure"]["final_accuracy"] - runs["plain"]["final_accuracy"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--k", default="10,100,1000", help="client counts, comma-separated")
    parser.add_argument("--tokens", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--threads", type=int, default=8, help="simulated clients answering at once")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each K (medians reported)")
    parser.add_argument("--out-dir", type=Path, default=None, help="results folder (default bench/results)")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("PLAIN_OUT", "SECURE_OUT"))
    args = parser.parse_args(argv)
    if args.compare:
        print(write_result("secagg-sst2", compare(*args.compare), out_dir=args.out_dir))
        return
    result = run([int(k) for k in args.k.split(",")], args.tokens, args.hidden, args.threads, args.repeats)
    print(write_result("secagg", result, out_dir=args.out_dir))


if __name__ == "__main__":
    main()
