"""Alembic environment: runs against the connection or URL the coordinator hands over."""

from __future__ import annotations

from alembic import context
from fedprompt.coordinator.persistence.db import WRITE_OPTION, Base, make_engine
from sqlalchemy import text
from sqlalchemy.engine import Connection

config = context.config
target_metadata = Base.metadata
_LOCK_ID = 0x6665_6470  # Postgres advisory lock: one migrator at a time across processes


def _run(connection: Connection) -> None:
    connection = connection.execution_options(**{WRITE_OPTION: True})  # SQLite: BEGIN IMMEDIATE
    context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": _LOCK_ID})
        context.run_migrations()


def run_migrations_online() -> None:
    """Migrate using a given connection, or a fresh engine for the configured URL."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = config.get_main_option("sqlalchemy.url")
    if url is None:
        raise RuntimeError("migrations: neither a connection nor sqlalchemy.url was given")
    engine = make_engine(url)
    with engine.connect() as conn:
        _run(conn)
    engine.dispose()


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
