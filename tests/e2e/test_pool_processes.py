"""Virtual clients: `fedprompt-worker pool` processes serving more clients than processes, against a real
coordinator, with the real MiniLM and SST-2."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from fedprompt.coordinator.persistence.db import Client, Update, make_engine, make_sessionmaker
from fedprompt.shared.client import CoordinatorClient
from sqlalchemy import func, select

from tests.helpers import (
    ADMIN,
    coordinator_process,
    start_pool,
    stop_all,
    wait_for,
    worker_status,
)

pytestmark = pytest.mark.slow

SPEC: dict[str, Any] = {"name": "pool", "max_length": 32, "batch_size": 4, "lr": 0.3, "quorum": 1}
K = 6


def _pool_file(path: Path, url: str, fid: int, token: str, ids: list[int], workdir: Path) -> Path:
    clients = [
        {
            "name": f"site-{i}",
            "state_dir": str(workdir / f"client-{i}"),
            "data": "sst2",
            "num_partitions": K,
            "partition_id": i,
            "train_limit": 240,
            "eval_limit": 60,
        }
        for i in ids
    ]
    config = {"coordinator": url, "federation": fid, "enrollment_token": token, "threads": 1}
    path.write_text(json.dumps({**config, "poll_wait": 1, "clients": clients}))
    return path


def _per_client_updates(db: str) -> tuple[int, dict[int, int]]:
    engine = make_engine(db)
    with make_sessionmaker(engine)() as s:
        clients = s.scalar(select(func.count()).select_from(Client)) or 0
        rows = s.execute(select(Update.client_id, func.count()).group_by(Update.client_id)).all()
    engine.dispose()
    return clients, {int(c): int(n) for c, n in rows}


def test_two_pool_processes_serve_six_clients_and_a_killed_one_loses_no_update(tmp_path: Path) -> None:
    """Six clients in two pool processes for two rounds; the first pool is killed while one of its
    clients trains round 1 and started again: its clients reuse their saved credentials, and every
    client's update of each round arrives once (one federation, where two would cost a coordinator's
    and two pools' start-ups more)."""
    db = f"sqlite:///{tmp_path / 'pool.db'}"
    procs: list[subprocess.Popen] = []
    with coordinator_process(db, tmp_path) as (url, _):
        admin = CoordinatorClient(url, ADMIN)
        fid = admin.create_federation(
            {
                **SPEC,
                "min_clients": K,
                "fraction": 1.0,
                "rounds": 2,
                "local_steps": 8,
                "round_deadline_s": 900,
            }
        ).id
        token = admin.create_enrollment_token(fid, max_uses=K)
        configs = [
            _pool_file(tmp_path / f"pool-{p}.json", url, fid, token, ids, tmp_path)
            for p, ids in enumerate([[0, 1, 2], [3, 4, 5]])
        ]
        try:
            victim, victim_url = start_pool(configs[0], tmp_path, "pool-0")
            other, other_url = start_pool(configs[1], tmp_path, "pool-1")
            procs += [victim, other]

            def training() -> bool:
                status = worker_status(victim_url)
                return bool(status) and any(
                    c["state"] == "training" and c["step"] >= 2 for c in status["clients"]
                )

            wait_for(training, 600, "a client of the first pool to be training", interval=0.05)
            assert admin.rounds(fid)[-1]["round"] == 1  # killed in round 1
            victim.send_signal(signal.SIGKILL)
            victim.wait(10)
            # The same pool again: its clients reuse their saved credentials and train the open round.
            again, again_url = start_pool(configs[0], tmp_path, "pool-0-again")
            procs.append(again)
            wait_for(lambda: admin.federation(fid).state == "completed", 600, "2 rounds to complete")
            rounds = admin.rounds(fid)
            assert [(r["round"], r["state"], r["stats"]["updates"]) for r in rounds] == [
                (1, "closed", K),
                (2, "closed", K),
            ]
            enrolled = {c["name"]: c["id"] for c in admin.clients(fid)}
            assert sorted(enrolled) == [f"site-{i}" for i in range(K)]
            # Each pool reports its three clients, each under the identity the coordinator gave that
            # name; the restarted pool's clients trained what was left of round 1, then round 2.
            for pool_url, trained in ((other_url, [[1, 2]]), (again_url, [[1, 2], [2]])):
                status = wait_for(lambda u=pool_url: worker_status(u), 30, "pool status")
                assert len(status["clients"]) == 3
                for client in status["clients"]:
                    assert client["client_id"] == enrolled[client["name"]]
                    assert client["rounds_trained"] in trained
            # The spec leaves the model's size out: the workers stated it once they had loaded MiniLM
            assert admin.federation(fid).model_extra["ledger"]["params_full_model"] == 22_713_216
        finally:
            stop_all(procs)
    clients, per_client = _per_client_updates(db)
    assert clients == K  # no second enrolment
    # every client's update of each round arrived once: none lost with the killed pool, none twice
    assert sorted(per_client) == sorted(enrolled.values()) and set(per_client.values()) == {2}
