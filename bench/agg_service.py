"""The coordinator's aggregation of one round, end to end: update blobs in the database → new version."""

from __future__ import annotations

import gc
import shutil
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from fedprompt.coordinator.persistence.db import Client, Round, Update, make_engine, make_sessionmaker
from fedprompt.coordinator.persistence.migrate import upgrade
from fedprompt.coordinator.service import Coordinator
from fedprompt.shared import wire
from fedprompt.shared.spec import FederationSpec
from sqlalchemy import select


def _prepare(path: Path, blobs: list[bytes]) -> tuple[int, int]:
    """A SQLite database with one open round whose K participants have all uploaded."""
    url = f"sqlite:///{path}"
    upgrade(url)
    engine = make_engine(url)
    service = Coordinator(make_sessionmaker(engine))
    k = len(blobs)
    spec = FederationSpec(
        name="bench", min_clients=k, expected_clients=k, fraction=1.0, rounds=3, auto_advance=False
    )
    fid = service.federations.create_federation(spec).id
    now = time.time()
    with service.sessions() as s, s.begin():
        s.add_all(
            Client(
                federation_id=fid,
                name=f"c{i}",
                token_hash=f"h{i}",
                num_samples=1,
                info={},
                enrolled_at=now,
                last_seen_at=now,
            )
            for i in range(k)
        )
    detail = service.cycle.open_round(fid)
    ids = sorted(p["client_id"] for p in detail["participants"])
    with service.sessions() as s, s.begin():
        rid = s.scalar(select(Round.id).where(Round.federation_id == fid))
        for cid, blob in zip(ids, blobs, strict=True):
            meta = wire.read_metadata(blob)
            s.add(
                Update(
                    round_id=rid,
                    client_id=cid,
                    blob=blob,
                    sha256=wire.sha256(blob),
                    num_samples=int(meta["num_samples"]),
                    metrics={},
                    size=len(blob),
                    created_at=now,
                )
            )
    engine.dispose()
    return fid, 1


def _close(path: Path, fid: int, number: int, *, trace: bool) -> tuple[float, int]:
    engine = make_engine(f"sqlite:///{path}")
    service = Coordinator(make_sessionmaker(engine))
    gc.collect()
    if trace:
        tracemalloc.start()
    t0 = time.perf_counter()
    service.cycle.close_round(fid, number)
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1] if trace else 0
    if trace:
        tracemalloc.stop()
    engine.dispose()
    return seconds, peak


def aggregate_round(blobs: list[bytes]) -> dict[str, Any]:
    """Seconds and peak traced memory of `close_round` over K uploaded blobs (FedAvg, SQLite)."""
    with tempfile.TemporaryDirectory(prefix="fedprompt-bench-") as tmp:
        base = Path(tmp) / "base.db"
        fid, number = _prepare(base, blobs)
        timed, traced = Path(tmp) / "timed.db", Path(tmp) / "traced.db"
        shutil.copy(base, timed)
        shutil.copy(base, traced)
        seconds, _ = _close(timed, fid, number, trace=False)
        _, peak = _close(traced, fid, number, trace=True)
    return {"seconds": seconds, "peak_mib": peak / 2**20, "backend": "sqlite"}
