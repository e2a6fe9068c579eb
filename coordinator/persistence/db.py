"""Database schema (SQLAlchemy 2) and engine set-up for SQLite and Postgres.

Times are UNIX seconds (float) so both backends compare them the same way.
"""

from __future__ import annotations

from typing import Any

from fedprompt.shared.vocab import FederationState, RoundState
from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    event,
)
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

WRITE_OPTION = "fedprompt_write"  # execution option marking a transaction that will write
MAX_ID = 2**31 - 1  # ids, round numbers and counts are 32-bit INTEGER columns on Postgres

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Declarative base with deterministic constraint names (Alembic needs them)."""

    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dict[str, Any]: JSON}


class Federation(Base):
    """A federation and its spec; state is waiting | running | paused | completed. model_parameters: the
    frozen model's parameter count as the first worker to state it enrolled with (only when the spec sets
    no params_full_model)."""

    __tablename__ = "federations"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16), default=FederationState.WAITING)
    paused: Mapped[bool] = mapped_column(Boolean, default=False)
    current_round: Mapped[int] = mapped_column(Integer, default=0)
    latest_version: Mapped[int] = mapped_column(Integer, default=0)
    model_parameters: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class EnrollmentToken(Base):
    """A token that lets a worker enrol; stored hashed."""

    __tablename__ = "enrollment_tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    federation_id: Mapped[int] = mapped_column(ForeignKey("federations.id", ondelete="CASCADE"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    max_uses: Mapped[int | None] = mapped_column(Integer, nullable=True)
    uses: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[float] = mapped_column(Float)


class Client(Base):
    """An enrolled worker; its token is only ever stored as a hash."""

    __tablename__ = "clients"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    federation_id: Mapped[int] = mapped_column(ForeignKey("federations.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    num_samples: Mapped[int] = mapped_column(Integer, default=0)
    info: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    enrolled_at: Mapped[float] = mapped_column(Float)
    last_seen_at: Mapped[float] = mapped_column(Float)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # base64 Ed25519 public key the client signs secure rounds with: pinned the first time it is shown,
    # never replaced (docs/secure-aggregation.md)
    signing_key: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # hex SHA-256 of the client certificate it enrolled with under mutual TLS (api/tls.py)
    tls_fingerprint: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # what the client last said it was doing: {"phase", "round", "step", "total_steps", "at"} from its
    # training heartbeat (coordinator/logic/sites.py reads a site's state off it and last_seen_at)
    activity: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class Round(Base):
    """One attempt at a round: open → aggregating → closed, or failed (then retried)."""

    __tablename__ = "rounds"
    __table_args__ = (UniqueConstraint("federation_id", "number", "attempt"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    federation_id: Mapped[int] = mapped_column(ForeignKey("federations.id", ondelete="CASCADE"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    state: Mapped[str] = mapped_column(String(16), default=RoundState.OPEN)
    base_version: Mapped[int] = mapped_column(Integer)
    result_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    opened_at: Mapped[float] = mapped_column(Float)
    deadline_at: Mapped[float] = mapped_column(Float)
    closed_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    closed_by: Mapped[str | None] = mapped_column(String(200), nullable=True)
    failure_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    stats: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class Participant(Base):
    """A client selected for a round attempt."""

    __tablename__ = "participants"
    __table_args__ = (UniqueConstraint("round_id", "client_id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    round_id: Mapped[int] = mapped_column(ForeignKey("rounds.id", ondelete="CASCADE"), index=True)
    client_id: Mapped[int] = mapped_column(ForeignKey("clients.id", ondelete="CASCADE"), index=True)
    downloaded_bytes: Mapped[int] = mapped_column(Integer, default=0)
    # mode async: when the client was handed this task (it holds one of the concurrency slots until it
    # uploads or round_deadline_s passes); None in sync rounds, where the round's selection decides
    dispatched_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class Update(Base):
    """An accepted client update: the safetensors blob as received."""

    __tablename__ = "updates"
    __table_args__ = (UniqueConstraint("round_id", "client_id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    round_id: Mapped[int] = mapped_column(ForeignKey("rounds.id", ondelete="CASCADE"), index=True)
    client_id: Mapped[int] = mapped_column(ForeignKey("clients.id", ondelete="CASCADE"), index=True)
    blob: Mapped[bytes] = mapped_column(LargeBinary)
    sha256: Mapped[str] = mapped_column(String(64))
    num_samples: Mapped[int] = mapped_column(Integer)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    size: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[float] = mapped_column(Float)
    # mode async: the buffer (an open round) whose version counts this update, which is its own round
    # unless that one had closed when it arrived, and how many versions stale it was there; None in
    # sync rounds
    buffer_round_id: Mapped[int | None] = mapped_column(
        ForeignKey("rounds.id", ondelete="CASCADE"), nullable=True, index=True
    )
    staleness: Mapped[int | None] = mapped_column(Integer, nullable=True)


class PromptVersion(Base):
    """The global prompt after each round; version 0 is the seeded initial prompt."""

    __tablename__ = "prompt_versions"
    __table_args__ = (UniqueConstraint("federation_id", "version"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    federation_id: Mapped[int] = mapped_column(ForeignKey("federations.id", ondelete="CASCADE"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    round_id: Mapped[int | None] = mapped_column(ForeignKey("rounds.id", ondelete="SET NULL"), nullable=True)
    blob: Mapped[bytes] = mapped_column(LargeBinary)
    sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Float)


class ServerOptimizerState(Base):
    """A federation's server-optimiser state (momentum, second moments, step count) after the prompt
    version it produced: float64 safetensors, written in the transaction that writes that version. Only
    the latest is kept: the next round starts from it, and older ones are deleted as it is written."""

    __tablename__ = "server_optimizer_states"
    __table_args__ = (UniqueConstraint("federation_id", "version"),)  # its index serves the lookups
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    federation_id: Mapped[int] = mapped_column(ForeignKey("federations.id", ondelete="CASCADE"))
    version: Mapped[int] = mapped_column(Integer)
    optimizer: Mapped[str] = mapped_column(String(32))
    blob: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[float] = mapped_column(Float)


class SecaggRound(Base):
    """A secure round attempt's plan (numbers, graph, k, t), its stage (keys | shares | masked | unmask |
    done | failed) and the clients (numbers) that completed each stage."""

    __tablename__ = "secagg_rounds"
    round_id: Mapped[int] = mapped_column(ForeignKey("rounds.id", ondelete="CASCADE"), primary_key=True)
    stage: Mapped[str] = mapped_column(String(16))
    plan: Mapped[dict[str, Any]] = mapped_column(JSON)
    reached: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    stage_started_at: Mapped[float] = mapped_column(Float)


class SecaggMessage(Base):
    """What a client posted in a stage: its public keys, an AES-GCM envelope for one recipient (client
    id), or the shares it revealed; recipient 0 when the message has none."""

    __tablename__ = "secagg_messages"
    __table_args__ = (UniqueConstraint("round_id", "stage", "sender_id", "recipient_id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    round_id: Mapped[int] = mapped_column(ForeignKey("rounds.id", ondelete="CASCADE"), index=True)
    stage: Mapped[str] = mapped_column(String(16))
    sender_id: Mapped[int] = mapped_column(ForeignKey("clients.id", ondelete="CASCADE"), index=True)
    recipient_id: Mapped[int] = mapped_column(Integer)
    payload: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[float] = mapped_column(Float)


class Evaluation(Base):
    """A client's metrics of one global prompt version on its local held-out data."""

    __tablename__ = "evaluations"
    __table_args__ = (UniqueConstraint("federation_id", "version", "client_id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    federation_id: Mapped[int] = mapped_column(ForeignKey("federations.id", ondelete="CASCADE"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    client_id: Mapped[int] = mapped_column(ForeignKey("clients.id", ondelete="CASCADE"), index=True)
    num_samples: Mapped[int] = mapped_column(Integer)
    accuracy: Mapped[float] = mapped_column(Float)
    loss: Mapped[float | None] = mapped_column(Float, nullable=True)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[float] = mapped_column(Float)


class RevokedSession(Base):
    """A dashboard session ended by its logout before its expiry (the cookie is an HMAC, valid on every
    replica until it expires; this record makes every replica refuse it). Kept until it would expire."""

    __tablename__ = "revoked_sessions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    session_hash: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 of the session's id
    expires_at: Mapped[float] = mapped_column(Float, index=True)
    revoked_at: Mapped[float] = mapped_column(Float)


class Event(Base):
    """An audit trail of what happened to a federation (round opened, failed, client revoked, ...)."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_federation_id_id", "federation_id", "id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    federation_id: Mapped[int] = mapped_column(ForeignKey("federations.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(64))
    round_number: Mapped[int | None] = mapped_column(Integer, nullable=True)
    message: Mapped[str] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float)


POOL_OVERFLOW = 5  # connections opened past pool_size when it is short, closed when given back


def make_engine(url: str, *, pool_size: int = 10) -> Engine:
    """An engine with the right per-backend settings (SQLite: WAL, foreign keys, write-serialised).

    `pool_size`: connections kept open, one for each thread that can hold one at a time (a short
    pool opens and closes connections, which costs a connect and, on SQLite, the pragmas).
    """
    if url.startswith("sqlite"):
        memory = url in ("sqlite://", "sqlite:///:memory:") or "mode=memory" in url
        pool = {} if memory else {"pool_size": pool_size, "max_overflow": POOL_OVERFLOW}
        engine = create_engine(
            url,
            connect_args={"timeout": 30, "check_same_thread": False},
            hide_parameters=True,  # a statement's error names no values: tokens' hashes, names, blobs
            **pool,
        )

        @event.listens_for(engine, "connect")
        def _sqlite_connect(dbapi_conn: Any, _record: Any) -> None:
            # Let SQLAlchemy emit BEGIN itself (pysqlite's implicit transactions break locking).
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA synchronous=FULL")
            cur.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn: Any) -> None:
            # Writing transactions take the write lock up front, so check-then-write is atomic and a
            # stale read snapshot can never need upgrading; reads stay concurrent (WAL).
            write = conn.get_execution_options().get(WRITE_OPTION, False)
            conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

        return engine
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    # No pre-ping: it costs a round trip on every checkout (at 1,000 clients the ingest benchmark's
    # upload p99 went from 1.0-2.3 s to 0.33 s without it). A connection the server dropped (a restart,
    # a failover) fails the one request that meets it, and SQLAlchemy then replaces every pooled
    # connection (tests/coordinator/test_postgres_pool.py); workers retry that request.
    return create_engine(url, pool_size=pool_size, max_overflow=POOL_OVERFLOW, hide_parameters=True)


def make_sessionmaker(engine: Engine) -> sessionmaker:
    """Sessions that keep loaded attributes after commit (we return them from services)."""
    return sessionmaker(engine, expire_on_commit=False)
