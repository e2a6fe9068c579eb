"""Shared fixtures: database backends (SQLite file, the real Postgres), services, apps."""

from __future__ import annotations

import os
import shutil
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
    """A new, empty database: its name and its SQLAlchemy URL."""
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


# The fixtures that want the schema at head (tests/coordinator/conftest.py). A test using one gets a
# database at head without running every migration again: on SQLite a copy of a file migrated once per
# session (per xdist worker); on Postgres the worker's own database migrated once, its rows deleted
# before each test (creating and dropping a database per test cost ~1 s of each of some 150 tests). The
# migrations themselves are tested from empty databases (tests/coordinator/test_migrations.py: its
# db_url stays empty).
AT_HEAD = frozenset({"api", "engine"})


@pytest.fixture(scope="session")
def sqlite_at_head(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated to head, to copy (its engine closed, so no write-ahead log is left)."""
    from fedprompt.coordinator.persistence.migrate import upgrade

    path = tmp_path_factory.mktemp("at-head") / "fedprompt.db"
    upgrade(f"sqlite:///{path}")
    assert not path.with_name(path.name + "-wal").exists()
    return path


@pytest.fixture(scope="session")
def pg_at_head(pg_server: str) -> Iterator[tuple[str, str]]:
    """This worker's Postgres database migrated to head: (name, URL)."""
    from fedprompt.coordinator.persistence.migrate import upgrade

    name, url = _new_pg_database(pg_server)
    upgrade(url)
    yield name, url
    _drop_pg_database(pg_server, name)


def _emptied(admin_url: str, name: str) -> None:
    """Every row of database `name` deleted but Alembic's, its sequences restarted, and any connection a
    previous test left to it closed (it could hold a lock the deletes would wait on). DELETE, not
    TRUNCATE: TRUNCATE gives each table new files, ~0.4 s against ~0.05 s for these few rows."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(f"{admin_url.rsplit('/', 1)[0]}/{name}", autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            [name],
        )
        tables = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'alembic_version'"
        ).fetchall()
        sequences = conn.execute(
            "SELECT sequencename FROM pg_sequences WHERE schemaname = 'public'"
        ).fetchall()
        with conn.transaction():
            conn.execute("SET LOCAL session_replication_role = replica")  # no foreign-key order to follow
            for (table,) in tables:
                conn.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(table)))
            for (sequence,) in sequences:
                conn.execute(sql.SQL("ALTER SEQUENCE {} RESTART").format(sql.Identifier(sequence)))


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Every backend: a SQLite file and a database on the real Postgres; fresh and empty, or at head
    with no rows when the test uses a fixture of AT_HEAD."""
    at_head = not AT_HEAD.isdisjoint(request.fixturenames)
    if request.param == "sqlite":
        path = tmp_path / "fedprompt.db"
        if at_head:
            shutil.copyfile(request.getfixturevalue("sqlite_at_head"), path)
        return f"sqlite:///{path}"
    if not at_head:
        return request.getfixturevalue("pg_url")
    name, url = request.getfixturevalue("pg_at_head")
    _emptied(request.getfixturevalue("pg_server"), name)
    return url
