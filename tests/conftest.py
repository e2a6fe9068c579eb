"""Shared fixtures: database backends (SQLite file, the real Postgres), services, apps."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The packed data sets the tests name live beside the repository on the development and CI machines
# (the product itself looks in $FEDPROMPT_DATASETS and the user's data folder only).
_SHARED_DATASETS = Path(__file__).resolve().parents[2] / "shared" / "datasets"
if _SHARED_DATASETS.is_dir():
    os.environ.setdefault("FEDPROMPT_DATASETS", str(_SHARED_DATASETS))
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

PG_ADMIN_URL = os.environ.get("FEDPROMPT_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


def _pg_available() -> bool:
    try:
        import psycopg

        with psycopg.connect(PG_ADMIN_URL, connect_timeout=3):
            return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def pg_server() -> str:
    """The admin URL of the real Postgres server; the suite fails loudly if it is down."""
    if not _pg_available():
        pytest.fail(f"PostgreSQL is not answering at {PG_ADMIN_URL}; start it (see .ci/run)")
    return PG_ADMIN_URL


def _new_pg_database(admin_url: str) -> tuple[str, str]:
    import psycopg

    name = f"fedprompt_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = admin_url.rsplit("/", 1)[0]
    return name, f"{base}/{name}".replace("postgresql://", "postgresql+psycopg://", 1)


def _drop_pg_database(admin_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg_url(pg_server: str) -> Iterator[str]:
    """A fresh, empty Postgres database for one test."""
    name, url = _new_pg_database(pg_server)
    try:
        yield url
    finally:
        _drop_pg_database(pg_server, name)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path) -> str:  # type: ignore[no-untyped-def]
    """Every backend: a SQLite file and a fresh database on the real Postgres."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'fedprompt.db'}"
    return request.getfixturevalue("pg_url")
