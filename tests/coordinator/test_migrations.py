"""The Alembic migrations produce exactly the ORM's schema, on every backend."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from fedprompt.coordinator.persistence.db import Base, make_engine
from fedprompt.coordinator.persistence.migrate import head_revision, schema_is_current, upgrade
from sqlalchemy import text


def test_migrations_match_models(db_url: str) -> None:
    upgrade(db_url)
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        assert diff == []
        assert schema_is_current(engine)
        upgrade(db_url)  # idempotent: a second `migrate` is a no-op
        with engine.connect() as conn:
            assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == head_revision()
    finally:
        engine.dispose()


def test_sqlite_runs_in_wal_mode_with_foreign_keys(tmp_path) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(f"sqlite:///{tmp_path / 'x.db'}")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    engine.dispose()
