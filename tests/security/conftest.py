"""Real `fedprompt-coordinator serve` processes for the hostile-input suite, their logs and databases.

Every check here is made against a process started as in production (uvicorn, httptools, JSON logs
at info, the access log included), on SQLite and on the real Postgres. A hostile request is sent
with an X-Request-ID; its log is what the process wrote from just before it until its access line
(or a moment, for connections refused before any route).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fedprompt.shared.local import free_port, wait_ready
from sqlalchemy import create_engine, text

from tests.conftest import _drop_pg_database, _new_pg_database
from tests.helpers import ADMIN, coordinator_cmd, federation_with_clients, stop_all

ADMIN_H = {"Authorization": f"Bearer {ADMIN}"}
# What one refused request may add to the log: its access line and little else (an error trace,
# which none of them may cause, is bounded at about 16 KB).
LOG_BYTES_PER_REQUEST = 4096


@dataclass
class Server:
    """A running coordinator process and its log file."""

    url: str
    proc: subprocess.Popen
    log: Path

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def log_size(self) -> int:
        """Where the log's complete lines end: the offset a later `log_since` reads from."""
        data = self.log.read_bytes()
        return data.rfind(b"\n") + 1

    def log_since(self, offset: int) -> str:
        """The log's complete lines from offset: a line still being written is left for the next read."""
        with self.log.open("rb") as fh:
            fh.seek(offset)
            data = fh.read()
        return data[: data.rfind(b"\n") + 1].decode("utf-8", "replace")

    def wait_logged(self, needle: str, offset: int, timeout: float = 10.0) -> str:
        """The log from offset once it contains needle (the access line of a request id)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log_since(offset)
            if needle in text:
                return text
            time.sleep(0.05)
        raise AssertionError(
            f"{needle!r} was not logged within {timeout} s:\n{self.log_since(offset)[-2000:]}"
        )


@contextmanager
def serve(database_url: str, data_dir: Path, env: dict[str, str] | None = None) -> Iterator[Server]:
    """`fedprompt-coordinator serve` on a loopback port: JSON logs at info into a file."""
    port = free_port()
    log = data_dir / f"coordinator-{port}.log"
    full_env = {
        **os.environ,
        "FEDPROMPT_DATABASE_URL": database_url,
        "FEDPROMPT_ADMIN_TOKEN": ADMIN,
        "FEDPROMPT_DATA_DIR": str(data_dir),
        "FEDPROMPT_SWEEP_INTERVAL_S": "0.5",
        "FEDPROMPT_LOG_FORMAT": "json",
        **(env or {}),
    }
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [*coordinator_cmd(), "serve", "--port", str(port), "--log-level", "info"],
            env=full_env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"

    def exited() -> None:
        if proc.poll() is not None:
            raise RuntimeError(f"coordinator exited with {proc.returncode}:\n{log.read_text()[-3000:]}")

    try:
        wait_ready(url, 60.0, exited)
        yield Server(url, proc, log)
    finally:
        stop_all([proc])


def snapshot(database_url: str) -> dict[str, str]:
    """A digest of every row of every table: equal snapshots, an unchanged database."""
    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "sqlite":
                names = conn.execute(text("SELECT name FROM sqlite_master WHERE type = 'table'")).scalars()
            else:
                names = conn.execute(
                    text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
                ).scalars()
            out = {}
            for name in sorted(names):
                rows = conn.execute(text(f'SELECT * FROM "{name}" ORDER BY 1')).all()
                out[name] = hashlib.sha256(repr(rows).encode()).hexdigest()
            return out
    finally:
        engine.dispose()


@contextmanager
def database(backend: str, tmp: Path, pg_admin: str | None) -> Iterator[str]:
    """A fresh SQLite file or Postgres database."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp / 'fedprompt.db'}"
        return
    assert pg_admin is not None
    name, url = _new_pg_database(pg_admin)
    try:
        yield url
    finally:
        _drop_pg_database(pg_admin, name)


@dataclass
class World:
    """A server with a federation, an open round 1 and three enrolled clients; the secrets it knows."""

    server: Server
    db: str
    fid: int
    enrolment: str
    clients: list[dict[str, Any]]
    secrets: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.server.url

    def client_h(self, i: int = 0) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.clients[i]['token']}"}


def populate(url: str, n_clients: int = 3) -> tuple[int, str, list[dict[str, Any]]]:
    """A federation (round 1 opens with the second enrolment) and its clients, through the API."""
    with httpx.Client(base_url=url, timeout=30) as api:
        return federation_with_clients(api, n_clients)


BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(scope="module", params=BACKENDS)
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """One coordinator per backend for a module of hostile requests."""
    backend = request.param
    pg_admin = request.getfixturevalue("pg_server") if backend == "postgres" else None
    tmp = tmp_path_factory.mktemp(f"hostile-{backend}")
    with database(backend, tmp, pg_admin) as url, serve(url, tmp) as server:
        fid, enrol, clients = populate(server.url)
        yield World(server, url, fid, enrol, clients, [ADMIN, enrol, *(c["token"] for c in clients)])


def assert_clean_log(text: str, secrets: list[str], markers: tuple[str, ...] = ()) -> None:
    """No secret and no piece of the request body in the log; JSON lines, no error or trace."""
    for secret in secrets:
        assert secret not in text, "a token reached the log"
    for marker in markers:
        assert marker not in text, f"the request body reached the log ({marker[:20]!r}…)"
    for line in text.splitlines():
        record = json.loads(line)
        assert record["level"] not in ("error", "critical"), line[:500]
        assert "exception" not in record, line[:500]


def request_id() -> str:
    return uuid.uuid4().hex
