"""Real worker processes (uvicorn, loopback) against a real coordinator, with the real MiniLM and SST-2."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from fedprompt.coordinator.persistence.db import Client, Update, make_engine, make_sessionmaker
from fedprompt.shared import wire
from fedprompt.shared.client import CoordinatorClient
from sqlalchemy import func, select

from tests.helpers import (
    ADMIN,
    coordinator_process,
    free_port,
    start_worker,
    stop_all,
    wait_for,
    worker_cmd,
    worker_status,
)

pytestmark = pytest.mark.slow

SPEC: dict[str, Any] = {"name": "e2e", "max_length": 48, "batch_size": 8, "lr": 0.3, "quorum": 1}


def _rounds_closed(admin: CoordinatorClient, fid: int, n: int) -> bool:
    return sum(r["state"] == "closed" for r in admin.rounds(fid)) >= n


def test_three_workers_two_rounds(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'e2e.db'}"
    with coordinator_process(db, tmp_path) as (url, _):
        admin = CoordinatorClient(url, ADMIN)
        fid = admin.create_federation({**SPEC, "min_clients": 3, "rounds": 2, "local_steps": 4}).id
        token = admin.create_enrollment_token(fid)
        workers = [start_worker(url, fid, token, i, 3, tmp_path) for i in range(3)]
        try:
            wait_for(lambda: admin.federation(fid).state == "completed", 600, "2 rounds to complete")
            rounds = admin.rounds(fid)
            assert [(r["round"], r["state"]) for r in rounds] == [(1, "closed"), (2, "closed")]
            assert all(r["stats"]["updates"] == 3 for r in rounds)
            versions = [wire.decode(admin.prompt(fid, v).blob)[0]["prompt_embeddings"] for v in (0, 1, 2)]
            assert not (versions[0] == versions[1]).all() and not (versions[1] == versions[2]).all()
            statuses = [wait_for(lambda u=u: worker_status(u), 30, "worker status") for _, u in workers]
            assert all(s["rounds_trained"] == [1, 2] for s in statuses)
            assert {s["client_id"] for s in statuses} == {c["id"] for c in admin.clients(fid)}
            ev = wait_for(
                lambda: (e := admin.rounds(fid)[1]["evaluation"]) and e["clients"] == 3 and e,
                60,
                "every worker's evaluation of round 2",
            )
            assert ev["num_samples"] == 60 and 0.0 <= ev["accuracy"] <= 1.0
        finally:
            stop_all([p for p, _ in workers])


def test_worker_killed_during_training_rejoins_without_duplicate(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'kill.db'}"
    with coordinator_process(db, tmp_path) as (url, _):
        admin = CoordinatorClient(url, ADMIN)
        # availability timeout 30 s: heartbeats every 3 s while training, stale after 9 s of silence
        spec = {**SPEC, "min_clients": 2, "rounds": 1, "local_steps": 40, "availability_timeout_s": 30}
        fid = admin.create_federation(spec).id
        token = admin.create_enrollment_token(fid)
        procs = []
        try:
            victim, victim_url = start_worker(url, fid, token, 0, 2, tmp_path)
            other, _ = start_worker(url, fid, token, 1, 2, tmp_path)
            procs += [victim, other]
            wait_for(
                lambda: (s := worker_status(victim_url)) and s["state"] == "training" and s["step"] >= 2,
                600,
                "the worker to be training",
            )
            cid = worker_status(victim_url)["client_id"]

            def state() -> str:
                return next(c["state"] for c in admin.clients(fid) if c["id"] == cid)

            wait_for(lambda: state() == "training", 30, "the coordinator to show it training")
            victim.send_signal(signal.SIGKILL)
            victim.wait(10)
            killed = time.monotonic()
            # shown stale within three missed heartbeats (9 s) and the heartbeat granularity (3 s)
            wait_for(lambda: state() == "stale", 30, "the killed site to be shown stale")
            assert time.monotonic() - killed <= 12 + 3  # + the polling of this loop and the sweep
            events = wait_for(
                lambda: [e for e in admin.events(fid) if e["kind"] == "client_stale"],
                30,
                "a client_stale event",
            )
            assert "last heartbeat: training round 1" in events[0]["message"]
            # Restart with the same state directory and no enrolment token: it reuses its credentials.
            again, again_url = start_worker(url, fid, None, 0, 2, tmp_path)
            procs.append(again)
            wait_for(lambda: admin.federation(fid).state == "completed", 600, "the round to complete")
            status = wait_for(lambda: worker_status(again_url), 30, "restarted worker status")
            assert status["rounds_trained"] == [1]
        finally:
            stop_all(procs)
    engine = make_engine(db)
    with make_sessionmaker(engine)() as s:
        assert s.scalar(select(func.count()).select_from(Client)) == 2  # no second enrolment
        per_client = s.execute(select(Update.client_id, func.count()).group_by(Update.client_id)).all()
        assert sorted(n for _, n in per_client) == [1, 1]
    engine.dispose()


def test_update_survives_coordinator_downtime(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'down.db'}"
    port = free_port()
    procs: list[subprocess.Popen] = []
    try:
        with coordinator_process(db, tmp_path, port=port) as (url, coord):
            admin = CoordinatorClient(url, ADMIN)
            fid = admin.create_federation(
                {**SPEC, "min_clients": 2, "rounds": 1, "local_steps": 30, "round_deadline_s": 900}
            ).id
            token = admin.create_enrollment_token(fid)
            a, a_url = start_worker(url, fid, token, 0, 2, tmp_path)
            token_file = tmp_path / "enrollment-token"  # as a mounted secret
            token_file.write_text(token + "\n")
            b, b_url = start_worker(
                url, fid, None, 1, 2, tmp_path, extra=["--enrollment-token-file", str(token_file)]
            )
            procs += [a, b]
            wait_for(
                lambda: all((s := worker_status(u)) and s["state"] == "training" for u in (a_url, b_url)),
                600,
                "both workers to be training",
            )
            coord.send_signal(signal.SIGKILL)
            coord.wait(10)
        # Both finish training while the coordinator is down and keep retrying their uploads.
        wait_for(
            lambda: all((s := worker_status(u)) and s["state"] == "uploading" for u in (a_url, b_url)),
            600,
            "both workers to retry their uploads",
        )
        assert all(
            any(p.iterdir()) for p in (tmp_path / "worker-0" / "pending", tmp_path / "worker-1" / "pending")
        )
        with coordinator_process(db, tmp_path, port=port) as (url, _):
            admin = CoordinatorClient(url, ADMIN)
            wait_for(lambda: admin.federation(fid).state == "completed", 120, "the round to complete")
            r1 = admin.rounds(fid)[0]
            assert r1["state"] == "closed" and r1["stats"]["updates"] == 2
            wait_for(
                lambda: not any((tmp_path / "worker-0" / "pending").iterdir()), 30, "pending file cleared"
            )
    finally:
        stop_all(procs)


def test_malformed_data_file_fails_at_start_with_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "mine.csv"
    bad.write_text("text,label\ngreat film,1\nbroken row with no label\nfine,0\n")
    done = subprocess.run(
        [
            *worker_cmd(),
            "serve",
            "--coordinator",
            "http://127.0.0.1:9",
            "--federation",
            "1",
            "--data",
            str(bad),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert f"{bad}:3" in done.stderr, done.stderr


def test_options_come_from_the_environment_and_an_empty_token_file_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "token"
    empty.write_text("\n")
    env = {
        **os.environ,
        "FEDPROMPT_COORDINATOR": "http://127.0.0.1:9",
        "FEDPROMPT_FEDERATION": "1",
        "FEDPROMPT_DATA": "sst2",
        "FEDPROMPT_ENROLLMENT_TOKEN_FILE": str(empty),
    }
    done = subprocess.run([*worker_cmd(), "serve"], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2
    assert f"the enrollment token file {empty} is empty" in done.stderr, done.stderr
