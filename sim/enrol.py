"""Enrolment of the simulated sites in worker order, before any worker process starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedprompt.shared.client import ApiError, CoordinatorClient
from fedprompt.sim.supervisor import SimulationError


def enrol_in_order(
    admin: CoordinatorClient,
    url: str,
    fid: int,
    token: str,
    setup: dict[str, Any],
    seed: int,
    workers: Path,
    *,
    eval_shares: int | None = None,
) -> None:
    """Enrol client-0 … client-(K-1) in that order, each into its worker's state folder, before any
    worker starts: client ids, and so the seeded selection of a round, follow the worker index instead
    of which process happened to enrol first. A worker that finds its credentials does not enrol."""
    from fedprompt.worker.shards import ShardSpec, shard_sizes
    from fedprompt.worker.state import Credentials, StateDir

    clients = int(setup["clients"])
    missing = [i for i in range(clients) if StateDir(workers / str(i)).load_credentials(fid) is None]
    if not missing:
        return
    try:
        sizes = shard_sizes(
            ShardSpec(
                data=setup["dataset"],
                partition=setup["partition"],
                num_partitions=clients,
                seed=seed,
                train_limit=setup.get("train_limit"),
                eval_limit=setup.get("eval_limit"),
                eval_shares=eval_shares,
            )
        )
    except ValueError as exc:  # DataError, PartitionError
        raise SimulationError(f"cannot give each of the {clients} clients its data: {exc}") from None
    for i in missing:
        try:
            enrolled = admin.enroll(
                fid, token, name=f"client-{i}", num_samples=sizes[i][0], info={"num_eval": sizes[i][1]}
            )
        except ApiError as exc:
            raise SimulationError(f"enrolling client-{i} failed: {exc}") from None
        StateDir(workers / str(i)).save_credentials(Credentials(url, fid, enrolled.client_id, enrolled.token))
