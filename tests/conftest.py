"""Shared fixtures: database backends (SQLite file, the real Postgres), services, apps."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Under pytest-xdist (`make test`) each worker gets its share of the cores for the OpenMP and BLAS
# thread pools of its own process and of every process it starts (servers, workers, simulations):
# two workers, each with pools as wide as the machine, would oversubscribe the cores, and spinning
# pool threads slow every test beside them.
if os.environ.get("PYTEST_XDIST_WORKER"):
    _share = str(max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)))
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, _share)

PG_ADMIN_URL = os.environ.get("FEDPROMPT_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")

# Data: tests read rows from the committed slices in tests/fixtures/datasets (`tests.fixtures`), and a bare
# name like "sst2" resolves as the product resolves it ($FEDPROMPT_DATASETS, the user's data folder, the
# built-in SST-2). Tests that need a whole packed set (its size, an accuracy on it, a set other than the
# built-in SST-2) are marked `needs_datasets`: they run when $FEDPROMPT_DATASETS names the folder of the
# full packed sets (CI sets it) and are skipped, with NEEDS_DATASETS as the one reason, otherwise.
FULL_DATASETS = os.environ.get("FEDPROMPT_DATASETS") or None
NEEDS_DATASETS = "needs the full packed data sets: set FEDPROMPT_DATASETS"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"needs_datasets: {NEEDS_DATASETS} (skipped when it is unset)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files marked slow (real processes, minutes) first, in their own order, then the rest.

    Under xdist's --dist loadfile a worker takes the next file in this order as it frees up, so the
    long files start early and the many short ones fill the end; in alphabetical order the wheel
    test and the largest federations often started last and the run waited on them alone.
    """
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("needs_datasets") is not None and FULL_DATASETS is None:
        pytest.skip(NEEDS_DATASETS)


@pytest.fixture
def full_datasets() -> Path:
    """The folder of the full packed data sets ($FEDPROMPT_DATASETS as the session started); mark the test
    `needs_datasets` so it is skipped, not failed, when the variable is unset."""
    if FULL_DATASETS is None:
        pytest.skip(NEEDS_DATASETS)
    folder = Path(FULL_DATASETS)
    assert folder.is_dir(), f"$FEDPROMPT_DATASETS={FULL_DATASETS} is not a folder"
    return folder


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
