"""`fedprompt simulate --mode async` end to end: real coordinator and worker-pool processes, real
MiniLM, SST-2, one client three times slower than the others. Each version holds exactly
buffer_size updates, and the slow client's update really arrives later: it waits twice its training
time, in wall-clock time, after training and before uploading."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fedprompt.coordinator.persistence.db import Client, Round, Update, make_engine, make_sessionmaker
from fedprompt.shared import wire
from sqlalchemy import select

pytestmark = pytest.mark.slow
FEDPROMPT = str(Path(sys.executable).parent / "fedprompt")


def test_simulate_async_with_a_slow_client(tmp_path: Path) -> None:
    out = tmp_path / "async"
    cmd = [
        FEDPROMPT, "simulate", "--dataset", "sst2", "--clients", "3", "--mode", "async", "--buffer-size", "3",
        "--rounds", "2", "--local-steps", "4", "--batch-size", "8", "--max-length", "48", "--train-limit", "300",
        "--eval-limit", "60", "--parallel", "2", "--client-speed", "1,1,3", "--out", str(out),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "buffer 1/2" in done.stdout  # the progress speaks of buffers
    results = json.loads((out / "results.json").read_text())
    assert results["spec"]["mode"] == "async" and results["slowdowns"] == [1.0, 1.0, 3.0]
    assert [r["round"] for r in results["rounds"]] == [1, 2]
    assert [r["participants"] for r in results["rounds"]] == [3, 3]  # the updates each buffer held
    assert 0 < results["rounds"][0]["elapsed_s"] < results["rounds"][1]["elapsed_s"]

    engine = make_engine(f"sqlite:///{out / 'fedprompt.db'}")
    try:
        with make_sessionmaker(engine)() as s:
            rounds = {r.id: r for r in s.scalars(select(Round))}
            assert sorted((r.number, r.state, r.closed_by) for r in rounds.values()) == [
                (1, "closed", "buffer-full"),
                (2, "closed", "buffer-full"),
            ]
            updates = s.scalars(select(Update)).all()
            assert sorted(rounds[u.buffer_round_id].number for u in updates) == [1, 1, 1, 2, 2, 2]
            slow = s.scalars(select(Client.id).where(Client.name == "client-2")).one()
            for u in updates:
                timing = json.loads(wire.decode(u.blob)[1]["timing"])
                seconds = json.loads(wire.decode(u.blob)[1]["metrics"])["seconds"]
                if u.client_id != slow:
                    assert timing["slowdown_wait_s"] == 0.0
                    continue
                assert timing["slowdown_wait_s"] == pytest.approx(2 * seconds, rel=0.01)
                assert u.created_at - timing["trained_at"] >= 0.95 * timing["slowdown_wait_s"]
    finally:
        engine.dispose()
