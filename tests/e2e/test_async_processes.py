"""Mode async (FedBuff) across real coordinator processes: two replicas on one database write each
version exactly once and count each update in exactly one buffer, whatever replica a client talks
to; a kill -9 with a buffer half full loses no acknowledged update."""

from __future__ import annotations

import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fedprompt.coordinator.logic.buffered import staleness_weight
from fedprompt.coordinator.persistence.db import (
    Event,
    PromptVersion,
    Round,
    Update,
    make_engine,
    make_sessionmaker,
)
from fedprompt.shared import wire
from fedprompt.shared.client import ApiError, CoordinatorClient
from fedprompt.shared.contract import DoneTask, EvaluateTask
from sqlalchemy import select

from tests.helpers import ADMIN, coordinator_process, update_blob

pytestmark = pytest.mark.slow

SPEC: dict[str, Any] = {
    "name": "buffered",
    "num_virtual_tokens": 8,
    "hidden_size": 16,
    "mode": "async",
    "concurrency": 4,
    "buffer_size": 3,
    "rounds": 6,
    "min_clients": 2,
    "expected_clients": 6,
    "round_deadline_s": 120,
}


def _client_loop(urls: list[str], fid: int, token: str, seed: int, stop: threading.Event) -> None:
    """A worker whose requests go to a random replica each time and whose training takes a random
    while, so updates arrive out of order and some of them stale."""
    rng = random.Random(seed)
    clients = [CoordinatorClient(u, token, timeout=30) for u in urls]
    try:
        while not stop.is_set():
            task = rng.choice(clients).task(fid, wait=1)
            if task is None:
                continue
            if isinstance(task, DoneTask):
                return
            if isinstance(task, EvaluateTask):
                rng.choice(clients).report_evaluation(fid, task.version, {"num_samples": 5, "accuracy": 0.5})
                continue
            assert wire.sha256(rng.choice(clients).prompt(fid, task.version).blob) == task.sha256
            time.sleep(rng.uniform(0.0, 0.6))
            blob = update_blob(
                SPEC, seed * 1000 + task.round, num_samples=10 + 7 * seed, base_version=task.version
            )
            try:
                status, _ = rng.choice(clients).upload(fid, task.round, blob)
                assert status in (200, 201)
            except ApiError as exc:  # too stale: ask again
                assert exc.status == 410, exc
    finally:
        for c in clients:
            c.close()


def _past_evaluations(client: CoordinatorClient, fid: int) -> Any:
    """The client's next task other than an evaluation (each reported at once), or None."""
    task = client.task(fid, wait=0)
    while isinstance(task, EvaluateTask):
        client.report_evaluation(fid, task.version, {"num_samples": 5, "accuracy": 0.5})
        task = client.task(fid, wait=0)
    return task


def _check_versions(db_url: str, fid: int) -> None:
    """Every version once, from its buffer's updates: x_v = x_{v−1} + Σ n·s(τ)·(y − x_b) / Σ n."""
    engine = make_engine(db_url)
    with make_sessionmaker(engine)() as s:
        rounds = s.scalars(select(Round).where(Round.federation_id == fid).order_by(Round.number)).all()
        assert [r.number for r in rounds] == list(range(1, SPEC["rounds"] + 1))
        assert all(r.state == "closed" for r in rounds)
        events = s.scalars(
            select(Event).where(Event.federation_id == fid, Event.kind == "round_closed")
        ).all()
        assert sorted(e.round_number for e in events) == list(range(1, SPEC["rounds"] + 1))
        versions = {
            v.version: wire.decode(v.blob)[0]
            for v in s.scalars(select(PromptVersion).where(PromptVersion.federation_id == fid))
        }
        assert sorted(versions) == list(range(SPEC["rounds"] + 1))
        base_of = {r.id: r.base_version for r in rounds}
        updates = s.scalars(select(Update).where(Update.round_id.in_(base_of))).all()
        counted = [u for u in updates if u.buffer_round_id is not None]
        assert len(counted) == len(updates)  # every stored update counts in exactly one buffer
        stale = 0
        for rnd in rounds:
            mine = [u for u in counted if u.buffer_round_id == rnd.id]
            assert len(mine) == SPEC["buffer_size"]  # the upload that fills a buffer writes its version
            x = versions[rnd.base_version]["prompt_embeddings"].astype(np.float64)
            change = np.zeros_like(x)
            for u in mine:
                assert u.staleness == rnd.base_version - base_of[u.round_id]
                stale += u.staleness > 0
                y = wire.decode(u.blob)[0]["prompt_embeddings"].astype(np.float64)
                change += (
                    u.num_samples
                    * staleness_weight(u.staleness)
                    * (y - versions[base_of[u.round_id]]["prompt_embeddings"])
                )
            want = x + change / sum(u.num_samples for u in mine)
            np.testing.assert_allclose(versions[rnd.number]["prompt_embeddings"], want, rtol=1e-5, atol=1e-6)
        assert stale > 0  # the random training times did make some updates stale
    engine.dispose()


def test_two_replicas_write_each_version_once_and_count_each_update_once(db_url: str, tmp_path: Path) -> None:
    with (
        coordinator_process(db_url, tmp_path) as (url_a, _),
        coordinator_process(db_url, tmp_path) as (url_b, _),
    ):
        admin = CoordinatorClient(url_a, ADMIN)
        fid = admin.create_federation(SPEC).id
        token = admin.create_enrollment_token(fid)
        creds = [
            CoordinatorClient([url_a, url_b][i % 2])
            .enroll(fid, token, name=f"c{i}", num_samples=10 + 7 * i, info={})
            .token
            for i in range(6)
        ]
        stop = threading.Event()
        threads = [
            threading.Thread(target=_client_loop, args=([url_a, url_b], fid, creds[i], i, stop), daemon=True)
            for i in range(6)
        ]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and admin.federation(fid).state != "completed":
            time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join(30)
        assert admin.federation(fid).state == "completed"
        admin.close()
    _check_versions(db_url, fid)


def test_kill_9_with_a_half_full_buffer_loses_no_acknowledged_update(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'crash.db'}"
    spec = {**SPEC, "expected_clients": 3, "rounds": 1}
    acknowledged: list[str] = []
    with coordinator_process(db, tmp_path) as (url, proc):
        admin = CoordinatorClient(url, ADMIN)
        fid = admin.create_federation(spec).id
        token = admin.create_enrollment_token(fid)
        creds = [
            CoordinatorClient(url).enroll(fid, token, name=f"c{i}", num_samples=10, info={}).token
            for i in range(3)
        ]
        clients = [CoordinatorClient(url, cred) for cred in creds]
        for i, c in enumerate(clients[:2]):
            task = _past_evaluations(c, fid)
            assert task is not None and task.round == 1
            status, body = c.upload(fid, 1, update_blob(spec, i, num_samples=10, base_version=0))
            assert status == 201
            acknowledged.append(body.sha256)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    with coordinator_process(db, tmp_path) as (url, _):
        admin = CoordinatorClient(url, ADMIN)
        assert admin.rounds(fid)[0]["state"] == "open"  # two of three: the buffer waits
        last = CoordinatorClient(url, creds[2])
        task = _past_evaluations(last, fid)
        assert task is not None and task.round == 1
        status, body = last.upload(fid, 1, update_blob(spec, 2, num_samples=10, base_version=0))
        assert status == 201
        acknowledged.append(body.sha256)
        for _ in range(100):
            if admin.rounds(fid)[0]["state"] == "closed":
                break
            time.sleep(0.1)
        assert admin.rounds(fid)[0]["state"] == "closed"
    engine = make_engine(db)
    with make_sessionmaker(engine)() as s:
        rnd = s.scalars(select(Round).where(Round.federation_id == fid, Round.number == 1)).one()
        updates = s.scalars(select(Update).where(Update.buffer_round_id == rnd.id)).all()
        assert sorted(u.sha256 for u in updates) == sorted(acknowledged)
        v1 = s.scalars(
            select(PromptVersion).where(PromptVersion.federation_id == fid, PromptVersion.version == 1)
        ).one()
        mean = sum(wire.decode(u.blob)[0]["prompt_embeddings"].astype(np.float64) for u in updates) / 3
        np.testing.assert_allclose(wire.decode(v1.blob)[0]["prompt_embeddings"], mean, rtol=1e-5, atol=1e-6)
    engine.dispose()
