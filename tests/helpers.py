"""Test helpers: update blobs, free ports, coordinator processes."""

from __future__ import annotations

import asyncio
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from fedprompt.shared import wire
from fedprompt.shared.local import free_port, wait_ready
from fedprompt.shared.spec import FederationSpec

ADMIN = "test-admin-token-0123456789abcdef"
SMALL_SPEC: dict[str, Any] = {
    "name": "test",
    "num_virtual_tokens": 4,
    "hidden_size": 8,
    "min_clients": 2,
    "quorum": 1,
    "rounds": 3,
    "fraction": 1.0,
}
ADMIN_AUTH = {"Authorization": f"Bearer {ADMIN}"}


def federation_with_clients(
    api: Any, n: int, *, spec: dict[str, Any] | None = None, prefix: str = "site-"
) -> tuple[int, str, list[dict[str, Any]]]:
    """Create a federation through the API (a TestClient or httpx client) and enrol n clients.

    Returns (federation id, enrolment token, the enrolment answers with client_id and token)."""
    fid = api.post("/api/v1/federations", json=spec or SMALL_SPEC, headers=ADMIN_AUTH).json()["id"]
    enrol = api.post(f"/api/v1/federations/{fid}/enrollment-tokens", json={}, headers=ADMIN_AUTH).json()[
        "token"
    ]
    clients = [
        api.post(
            f"/api/v1/federations/{fid}/clients",
            json={"name": f"{prefix}{i}", "num_samples": 5},
            headers={"Authorization": f"Bearer {enrol}"},
        ).json()
        for i in range(n)
    ]
    return fid, enrol, clients


def report(service: Any, fid: int, version: int, client: Any, payload: dict[str, Any]) -> bool:
    """A client's evaluation report through the service, awaited as the route awaits it."""
    return asyncio.run(service.uploads.report_evaluation(fid, version, client, payload))


def random_tensors(spec: FederationSpec | dict[str, Any], seed: int) -> dict[str, np.ndarray]:
    """Random prompt tensors of the right shapes."""
    spec = spec if isinstance(spec, FederationSpec) else FederationSpec.model_validate(spec)
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in spec.tensor_shapes().items()}


def update_blob(
    spec: FederationSpec | dict[str, Any],
    seed: int,
    *,
    num_samples: int = 10,
    base_version: int | None = None,
    metrics: dict[str, float] | None = None,
) -> bytes:
    """A valid update body for the spec."""
    meta: dict[str, Any] = {"num_samples": str(num_samples), "method": "prompt_tuning"}
    if base_version is not None:
        meta["base_version"] = str(base_version)
    if metrics is not None:
        meta["metrics"] = metrics
    return wire.encode(random_tensors(spec, seed), meta)


def _exited(proc: subprocess.Popen | None) -> Any:
    def check() -> None:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before becoming ready")

    return check


def coordinator_cmd() -> list[str]:
    """The coordinator console script next to this interpreter."""
    return [str(Path(sys.executable).parent / "fedprompt-coordinator")]


@contextmanager
def coordinator_process(
    database_url: str,
    data_dir: Path,
    *,
    port: int | None = None,
    extra_env: dict[str, str] | None = None,
    verify: ssl.SSLContext | None = None,
) -> Iterator[tuple[str, subprocess.Popen]]:
    """A real `fedprompt-coordinator serve` process on a loopback port (https, checked with `verify`,
    when `extra_env` gives it a certificate)."""
    port = port or free_port()
    env = {
        **os.environ,
        "FEDPROMPT_DATABASE_URL": database_url,
        "FEDPROMPT_ADMIN_TOKEN": ADMIN,
        "FEDPROMPT_DATA_DIR": str(data_dir),
        "FEDPROMPT_SWEEP_INTERVAL_S": "0.2",
        **(extra_env or {}),
    }
    log = open(data_dir / f"coordinator-{port}.log", "ab")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [*coordinator_cmd(), "serve", "--port", str(port), "--log-level", "warning"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"{'https' if verify is not None else 'http'}://127.0.0.1:{port}"
    try:
        wait_ready(url, 60.0, _exited(proc), verify=True if verify is None else verify)
        yield url, proc
    finally:
        stop_all([proc])
        log.close()


def worker_cmd() -> list[str]:
    """The worker console script next to this interpreter."""
    return [str(Path(sys.executable).parent / "fedprompt-worker")]


def start_pool(config: Path, workdir: Path, name: str) -> tuple[subprocess.Popen, str]:
    """`fedprompt-worker pool --config CONFIG` on a free port, its output in WORKDIR/NAME.log; (process, URL)."""
    port = free_port()
    log = open(workdir / f"{name}.log", "ab")  # noqa: SIM115 - owned by the process
    proc = subprocess.Popen(
        [*worker_cmd(), "pool", "--config", str(config), "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    return proc, f"http://127.0.0.1:{port}"


def start_worker(
    coordinator: str,
    fid: int,
    token: str | None,
    index: int,
    k: int,
    workdir: Path,
    *,
    port: int | None = None,
    data: str = "sst2",
    extra: list[str] | None = None,
) -> tuple[subprocess.Popen, str]:
    """A real `fedprompt-worker serve` process on a small SST-2 slice; returns (process, its URL)."""
    port = port or free_port()
    args = [
        *worker_cmd(),
        "serve",
        "--coordinator",
        coordinator,
        "--federation",
        str(fid),
        "--data",
        data,
        "--num-partitions",
        str(k),
        "--partition-id",
        str(index),
        "--train-limit",
        "240",
        "--eval-limit",
        "60",
        "--state-dir",
        str(workdir / f"worker-{index}"),
        "--port",
        str(port),
        "--threads",
        "1",
        "--poll-wait",
        "1",
        "--name",
        f"site-{index}",
        *(extra or []),
    ]
    if token:
        args += ["--enrollment-token", token]
    log = open(workdir / f"worker-{index}.log", "ab")  # noqa: SIM115 - owned by the process
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def worker_status(url: str) -> dict[str, Any] | None:
    """A worker's /status, or None while it is not answering."""
    try:
        return httpx.get(f"{url}/status", timeout=2).json()
    except httpx.HTTPError:
        return None


def wait_for(predicate: Any, timeout: float, what: str, interval: float = 0.2) -> Any:
    """Poll until predicate() is truthy; fail with `what` after timeout seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


def stop_all(procs: list[subprocess.Popen]) -> None:
    """SIGTERM, then SIGKILL what is left."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def processes_mentioning(text: str) -> list[tuple[int, str]]:
    """Live processes whose command line contains `text` (reads /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().split(") ", 1)[1][0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append((int(entry.name), cmdline))
    return found


def enrol_clients(
    api: Any, spec: dict[str, Any], n: int, *, num_samples: int = 10
) -> tuple[int, list[dict[str, str]]]:
    """Create a federation through the API and enrol n clients; returns (fid, their auth headers)."""
    fid = api.post("/api/v1/federations", json=spec, headers=ADMIN_AUTH).json()["id"]
    token = api.post(f"/api/v1/federations/{fid}/enrollment-tokens", json={}, headers=ADMIN_AUTH).json()[
        "token"
    ]
    headers = []
    for i in range(n):
        r = api.post(
            f"/api/v1/federations/{fid}/clients",
            json={"name": f"site-{i}", "num_samples": num_samples},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert r.status_code == 201, r.text
        headers.append({"Authorization": f"Bearer {r.json()['token']}"})
    return fid, headers


def simulate_in_process(*args: str) -> Any:
    """`fedprompt simulate ARGS` run in this process (typer's CliRunner): for options refused before
    any process starts, without paying a new interpreter's imports per case."""
    import typer
    from fedprompt.sim.simulate import simulate_command
    from typer.testing import CliRunner

    app = typer.Typer()
    app.command("simulate")(simulate_command)
    app.command("other")(lambda: None)  # two commands: typer keeps the command's name
    return CliRunner().invoke(app, ["simulate", *args], catch_exceptions=False)
