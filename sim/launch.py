"""How `fedprompt simulate` starts its processes: the run's folder, environment and CPU split (`Run`),
the coordinator on a loopback port, and each worker pool's file of virtual clients (their shards,
state folders, slowdowns and backdoors)."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedprompt.shared.local import free_port, wait_ready
from fedprompt.shared.privacy import client_noise_seed
from fedprompt.sim.options import SimulateOptions
from fedprompt.sim.supervisor import Processes, SimulationError, bin_path
from fedprompt.sim.tables import console
from fedprompt.worker.pool import BackdoorEntry, ClientEntry, PoolConfig


@dataclass(frozen=True)
class Run:
    """Where and how this run's processes live: the results folder, their environment and CPU shares."""

    out: Path
    env: dict[str, str]
    admin_token: str
    cores: int
    parallel: int
    threads: int
    processes: int

    @property
    def state_path(self) -> Path:
        """simulation.json: the federation and set-up of this folder (its presence means: continue)."""
        return self.out / "simulation.json"

    @classmethod
    def prepare(cls, opts: SimulateOptions, out: Path) -> Run:
        """Make the folders; the coordinator's database, a fresh admin token, the CPU split."""
        (out / "logs").mkdir(parents=True, exist_ok=True)
        cores = os.cpu_count() or 1
        parallel = opts.parallel or cores
        admin_token = secrets.token_urlsafe(32)
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
            "FEDPROMPT_DATABASE_URL": opts.database_url or f"sqlite:///{out / 'fedprompt.db'}",
            "FEDPROMPT_ADMIN_TOKEN": admin_token,
            "FEDPROMPT_DATA_DIR": str(out),
            "FEDPROMPT_SWEEP_INTERVAL_S": "0.5",
            # every client enrols from this machine's loopback address: the per-address limit, made
            # for a coordinator on a network, would refuse a simulation of more than 120 clients
            "FEDPROMPT_ENROLMENT_RATE_LIMIT": os.environ.get(
                "FEDPROMPT_ENROLMENT_RATE_LIMIT", f"{max(120, 2 * opts.clients)}/minute"
            ),
            # glibc gives each thread that allocates its own arena (up to 8 per core) and keeps what it
            # frees there: a pool process runs one thread per client, so without a cap its memory grew
            # with the number of distinct clients it had trained (README, "Simulating a federation")
            "MALLOC_ARENA_MAX": os.environ.get("MALLOC_ARENA_MAX", "2"),
        }
        processes = min(opts.processes or (1 if opts.device == "cuda" else cores), opts.clients)
        threads = max(1, cores // min(parallel, processes))
        return cls(out, env, admin_token, cores, parallel, threads, processes)


def announce(url: str, out: Path, admin_token: str) -> Path:
    """Write the coordinator's admin token to <out>/admin-token (0600) and say where the dashboard, the
    API and the token are, for an operator who wants to watch or steer the run; the token's file."""
    token_file = out / "admin-token"
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(admin_token + "\n")
    os.chmod(token_file, 0o600)
    console.print(
        f"coordinator {url}: dashboard {url}/dashboard, API {url}/docs; admin token in {token_file} "
        f"(export FEDPROMPT_COORDINATOR={url} FEDPROMPT_ADMIN_TOKEN=$(cat {token_file}))",
        soft_wrap=True,
    )
    return token_file


def start_coordinator(procs: Processes, run: Run, port: int | None = None) -> str:
    """`fedprompt-coordinator serve` on a loopback port (a free one unless given); its URL once it
    answers."""
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    procs.start(
        "coordinator",
        [bin_path("fedprompt-coordinator"), "serve", "--port", str(port), "--log-level", "warning"],
        run.out / "logs" / "coordinator.log",
        run.env,
    )
    try:
        wait_ready(url, check=procs.check)
    except TimeoutError as exc:
        raise SimulationError(str(exc)) from None
    return url


def client_entry(
    i: int, fid: int, setup: dict[str, Any], seed: int, run: Run, *, eval_shares: int | None = None
) -> ClientEntry:
    """Client i: its shard of the data set (of the test split too when i < eval_shares, or always
    without), its state folder, its slowdown, and the backdoor if it is malicious."""
    door, slowdowns = setup.get("backdoor") or {}, setup.get("slowdowns")
    malicious = bool(door) and i < int(door["malicious"])
    backdoor = None
    # the ASR only where it means something: a backdoor in the federation, or asked for (--measure-asr)
    attacked = bool(door) and (int(door["malicious"]) > 0 or bool(door.get("measure_asr")))
    if attacked and door.get("target_label") is not None:
        backdoor = BackdoorEntry(
            target_label=int(door["target_label"]),
            trigger=door["trigger"],
            trigger_position=door["trigger_position"],
            poison_rate=float(door["poison_rate"]) if malicious else 0.0,
            attack=door["attack"] if malicious else "none",
        )
    return ClientEntry(
        name=f"client-{i}",
        state_dir=run.out / "workers" / str(i),
        data=setup["dataset"],
        partition=setup["partition"],
        num_partitions=int(setup["clients"]),
        partition_id=i,
        seed=seed,
        train_limit=setup.get("train_limit") or None,
        eval_limit=setup.get("eval_limit") or None,
        eval_shares=eval_shares,
        backdoor=backdoor,
        ldp_seed=client_noise_seed(seed, i),  # reproducible LDP noise (production workers: OS entropy)
        slowdown=slowdowns[i] if slowdowns else 1.0,
    )


def pool_file(
    p: int, url: str, fid: int, token: str, members: list[ClientEntry], run: Run, device: str
) -> Path:
    """The pool file of worker process p (0600: it holds the enrolment token)."""
    config = PoolConfig(
        coordinator=url,
        federation=fid,
        enrollment_token=token,
        device=device,
        threads=run.threads,
        thread_budget=None if device == "cuda" else run.cores,
        slots_dir=run.out / "slots",
        slots=run.parallel,
        clients=members,
    )
    path = run.out / "pools" / f"pool-{p}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(config.model_dump_json(indent=2))
    return path
