"""Real coordinator processes: two replicas on one Postgres, and a kill -9 in the middle of a round."""

from __future__ import annotations

import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fedprompt.coordinator.persistence.db import (
    Event,
    PromptVersion,
    Round,
    Update,
    make_engine,
    make_sessionmaker,
)
from fedprompt.shared import wire
from fedprompt.shared.client import CoordinatorClient
from fedprompt.shared.contract import DoneTask, EvaluateTask
from sqlalchemy import select, text

from tests.helpers import ADMIN, coordinator_process, update_blob

pytestmark = pytest.mark.slow


def _weighted_mean(blobs: list[tuple[bytes, int]]) -> dict[str, np.ndarray]:
    decoded = [(wire.decode(b)[0], n) for b, n in blobs]
    total = sum(n for _, n in decoded)
    return {
        name: sum(t[name].astype(np.float64) * (n / total) for t, n in decoded).astype(np.float32)
        for name in decoded[0][0]
    }


def _client_loop(
    urls: list[str], fid: int, token: str, spec: dict[str, Any], seed: int, stop: threading.Event
) -> None:
    """A simulated worker whose requests go to a random coordinator replica each time."""
    rng = random.Random(seed)
    clients = [CoordinatorClient(u, token, timeout=30) for u in urls]
    try:
        while not stop.is_set():
            c = rng.choice(clients)
            task = c.task(fid, wait=1)
            if task is None:
                continue
            if isinstance(task, DoneTask):
                return
            prompt = rng.choice(clients).prompt(fid, task.version)
            assert wire.sha256(prompt.blob) == task.sha256
            if isinstance(task, EvaluateTask):
                rng.choice(clients).report_evaluation(
                    fid, task.version, {"num_samples": 5 + seed, "accuracy": 0.5}
                )
                continue
            blob = update_blob(
                spec, seed * 1000 + task.round, num_samples=10 + 7 * seed, base_version=task.version
            )
            status, _ = rng.choice(clients).upload(fid, task.round, blob)
            assert status in (200, 201)
    finally:
        for c in clients:
            c.close()


def test_two_replicas_on_one_database_aggregate_each_round_exactly_once(db_url: str, tmp_path: Path) -> None:
    spec = {
        "name": "replicas",
        "num_virtual_tokens": 20,
        "hidden_size": 384,
        "rounds": 5,
        "fraction": 0.5,
        "min_clients": 2,
        "expected_clients": 6,
        "quorum": 1,
        "round_deadline_s": 120,
    }
    with (
        coordinator_process(db_url, tmp_path) as (url_a, _),
        coordinator_process(db_url, tmp_path) as (url_b, _),
    ):
        admin = CoordinatorClient(url_a, ADMIN)
        fid = admin.create_federation(spec).id
        token = admin.with_token(ADMIN).create_enrollment_token(fid)
        creds = []
        for i in range(6):
            enrol = CoordinatorClient([url_a, url_b][i % 2]).enroll(
                fid, token, name=f"c{i}", num_samples=10 + 7 * i, info={}
            )
            creds.append(enrol.token)
        stop = threading.Event()
        threads = [
            threading.Thread(
                target=_client_loop, args=([url_a, url_b], fid, creds[i], spec, i, stop), daemon=True
            )
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

    engine = make_engine(db_url)
    with make_sessionmaker(engine)() as s:
        rounds = s.scalars(select(Round).where(Round.federation_id == fid).order_by(Round.number)).all()
        assert [r.number for r in rounds] == [1, 2, 3, 4, 5]  # no retries, no duplicates
        assert all(r.state == "closed" for r in rounds)
        closed_events = s.scalars(
            select(Event).where(Event.federation_id == fid, Event.kind == "round_closed")
        ).all()
        assert sorted(e.round_number for e in closed_events) == [1, 2, 3, 4, 5]
        versions = s.scalars(
            select(PromptVersion).where(PromptVersion.federation_id == fid).order_by(PromptVersion.version)
        ).all()
        assert [v.version for v in versions] == [0, 1, 2, 3, 4, 5]
        for rnd in rounds:
            assert (rnd.base_version, rnd.result_version) == (rnd.number - 1, rnd.number)
            updates = s.scalars(select(Update).where(Update.round_id == rnd.id)).all()
            assert len(updates) == 3  # ceil(0.5 * 6)
            expected = _weighted_mean([(u.blob, u.num_samples) for u in updates])
            got = wire.decode(versions[rnd.number].blob)[0]
            for name in expected:
                np.testing.assert_allclose(got[name], expected[name], rtol=1e-6, atol=1e-7)
    engine.dispose()


def _drop_listen_connection(db_url: str, pid: int) -> int:
    """Terminate the LISTEN connection of coordinator process `pid`, as a network fault would."""
    engine = make_engine(db_url)
    with engine.begin() as conn:
        dropped = conn.execute(
            text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = :name"
            ),
            {"name": f"fedprompt-listen-{pid}"},
        ).scalar_one()
    engine.dispose()
    return int(dropped)


@pytest.mark.parametrize("dropped", [False, True], ids=["announced", "announcement-missed"])
@pytest.mark.postgres
def test_a_change_made_by_one_replica_reaches_a_poll_waiting_on_another(
    pg_url: str, tmp_path: Path, dropped: bool
) -> None:
    """A client long-polls replica B for its next task while the operator closes round 1 through
    replica A, whose sweep then opens round 2. B hears of it through Postgres NOTIFY, long before its own stamp reader's
    interval (30 s here) would look; with B's announcements' connection dropped just before, B still
    delivers the task, within its interval (3 s here) at most."""
    interval = "3" if dropped else "30"
    spec = {
        "name": "announce",
        "num_virtual_tokens": 4,
        "hidden_size": 8,
        "rounds": 2,
        "fraction": 1.0,
        "min_clients": 2,
        "expected_clients": 2,
        "quorum": 1,
        "round_deadline_s": 600,
    }
    # B never sweeps after its start: round 2 is opened by A (clients without test data: no evaluations)
    b_env = {"FEDPROMPT_LONG_POLL_INTERVAL_S": interval, "FEDPROMPT_SWEEP_INTERVAL_S": "3600"}
    with (
        coordinator_process(pg_url, tmp_path) as (url_a, _),
        coordinator_process(pg_url, tmp_path, extra_env=b_env) as (url_b, proc_b),
    ):
        admin = CoordinatorClient(url_a, ADMIN)
        fid = admin.create_federation(spec).id
        token = admin.create_enrollment_token(fid)
        creds = [
            CoordinatorClient(url_a)
            .enroll(fid, token, name=f"c{i}", num_samples=10, info={"num_eval": 0})
            .token
            for i in range(2)
        ]
        on_a, on_b = (
            CoordinatorClient(url_a, creds[0], timeout=120),
            CoordinatorClient(url_b, creds[0], timeout=120),
        )
        task = on_a.task(fid, wait=30)  # round 1 opens (A's sweep) with both clients selected
        assert task is not None and task.kind == "train"
        status, _ = on_a.upload(
            fid, task.round, update_blob(spec, 1, num_samples=10, base_version=task.version)
        )
        assert status == 201
        assert on_b.task(fid, wait=0) is None  # uploaded; the round waits for the other client
        if dropped:
            assert _drop_listen_connection(pg_url, proc_b.pid) == 1
        got: list[Any] = []
        waiting = threading.Thread(target=lambda: got.append((on_b.task(fid, wait=60), time.monotonic())))
        waiting.start()
        time.sleep(1.0)  # the poll waits on B
        closed_at = time.monotonic()
        admin.close_round(fid, 1)  # through A: version 1 is made there, and round 2 opens
        waiting.join(90)
        (found, at) = got[0]
        assert found is not None and found.kind == "train" and (found.round, found.version) == (2, 1)
        assert at - closed_at < 20 if not dropped else at - closed_at < 3 + 15  # 15 s: a loaded machine
        for c in (admin, on_a, on_b):
            c.close()


def test_kill_9_after_acknowledged_uploads_loses_nothing(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'crash.db'}"
    spec = {
        "name": "crash",
        "num_virtual_tokens": 8,
        "hidden_size": 16,
        "rounds": 2,
        "min_clients": 3,
        "quorum": 3,
    }
    acknowledged: list[str] = []
    with coordinator_process(db, tmp_path) as (url, proc):
        admin = CoordinatorClient(url, ADMIN)
        fid = admin.create_federation(spec).id
        token = admin.create_enrollment_token(fid)
        creds = [
            CoordinatorClient(url).enroll(fid, token, name=f"c{i}", num_samples=5 * (i + 1), info={}).token
            for i in range(3)
        ]
        assert admin.federation(fid).open_round.round == 1
        for i in range(2):
            status, body = CoordinatorClient(url, creds[i]).upload(
                fid, 1, update_blob(spec, i, num_samples=5 * (i + 1))
            )
            assert status == 201
            acknowledged.append(body.sha256)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    with coordinator_process(db, tmp_path) as (url, _):
        last = CoordinatorClient(url, creds[2])
        # The round is still open after the restart, with both acknowledged uploads.
        admin = CoordinatorClient(url, ADMIN)
        r1 = admin.rounds(fid)[0]
        assert r1["state"] == "open" and sum(p["uploaded"] for p in r1["participants"]) == 2
        status, body = last.upload(fid, 1, update_blob(spec, 2, num_samples=15))
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
        updates = s.scalars(select(Update).where(Update.round_id == rnd.id)).all()
        assert sorted(u.sha256 for u in updates) == sorted(acknowledged)
        v1 = s.scalars(
            select(PromptVersion).where(PromptVersion.federation_id == fid, PromptVersion.version == 1)
        ).one()
        expected = _weighted_mean([(u.blob, u.num_samples) for u in updates])
        np.testing.assert_allclose(
            wire.decode(v1.blob)[0]["prompt_embeddings"], expected["prompt_embeddings"], rtol=1e-6
        )
    engine.dispose()


def test_oversized_upload_is_refused_before_the_body_is_read(tmp_path: Path) -> None:
    import socket

    db = f"sqlite:///{tmp_path / 'limit.db'}"
    spec = {"name": "limit", "num_virtual_tokens": 4, "hidden_size": 8, "min_clients": 1}
    with coordinator_process(db, tmp_path, extra_env={"FEDPROMPT_MAX_UPLOAD_BYTES": "65536"}) as (url, _):
        admin = CoordinatorClient(url, ADMIN)
        fid = admin.create_federation(spec).id
        cred = CoordinatorClient(url).enroll(
            fid, admin.create_enrollment_token(fid), name="c", num_samples=1, info={}
        )
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            head = (
                f"PUT /api/v1/federations/{fid}/rounds/1/update HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Authorization: Bearer {cred.token}\r\nContent-Type: application/octet-stream\r\n"
                "Content-Length: 1000000000\r\n\r\n"
            )
            sock.sendall(head.encode() + b"\0" * 1024)  # 1 KiB of a declared 1 GB: the answer must not wait
            reply = sock.recv(4096).decode(errors="replace")
        assert reply.startswith("HTTP/1.1 413"), reply
        assert "application/problem+json" in reply
        assert admin.rounds(fid)[0]["participants"][0]["uploaded"] is False


def test_idle_connections_outlive_the_clients_keep_alive(tmp_path: Path) -> None:
    """httpx drops an idle connection after 5 s; the server must keep it longer, or a client that
    reuses it at 5 s races the server's close (a reset instead of an answer)."""
    import http.client

    def get(conn: http.client.HTTPConnection) -> int:
        conn.request("GET", "/healthz")
        response = conn.getresponse()
        response.read()
        return response.status

    db = f"sqlite:///{tmp_path / 'keepalive.db'}"
    with coordinator_process(db, tmp_path) as (url, _):  # the default keep-alive
        conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=10)
        assert get(conn) == 200
        first = conn.sock
        time.sleep(6.5)  # past uvicorn's own default (5 s) and httpx's
        assert get(conn) == 200 and conn.sock is first  # the same connection answered
        conn.close()
    with coordinator_process(db, tmp_path, extra_env={"FEDPROMPT_KEEP_ALIVE_S": "1"}) as (url, _):
        conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=10)
        assert get(conn) == 200
        time.sleep(2.5)
        with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
            get(conn)  # the server closed the idle connection after 1 s
        conn.close()
