"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-30 12:42:31.523371
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "federations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("current_round", sa.Integer(), nullable=False),
        sa.Column("latest_version", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_federations")),
    )
    op.create_table(
        "clients",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("federation_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("num_samples", sa.Integer(), nullable=False),
        sa.Column("info", sa.JSON(), nullable=False),
        sa.Column("enrolled_at", sa.Float(), nullable=False),
        sa.Column("last_seen_at", sa.Float(), nullable=False),
        sa.Column("revoked_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["federation_id"],
            ["federations.id"],
            name=op.f("fk_clients_federation_id_federations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_clients")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_clients_token_hash")),
    )
    with op.batch_alter_table("clients", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_clients_federation_id"), ["federation_id"], unique=False)

    op.create_table(
        "enrollment_tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("federation_id", sa.Integer(), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=True),
        sa.Column("max_uses", sa.Integer(), nullable=True),
        sa.Column("uses", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["federation_id"],
            ["federations.id"],
            name=op.f("fk_enrollment_tokens_federation_id_federations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_enrollment_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_enrollment_tokens_token_hash")),
    )
    with op.batch_alter_table("enrollment_tokens", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_enrollment_tokens_federation_id"), ["federation_id"], unique=False
        )

    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("federation_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("round_number", sa.Integer(), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["federation_id"],
            ["federations.id"],
            name=op.f("fk_events_federation_id_federations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
    )
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.create_index("ix_events_federation_id_id", ["federation_id", "id"], unique=False)

    op.create_table(
        "rounds",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("federation_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("base_version", sa.Integer(), nullable=False),
        sa.Column("result_version", sa.Integer(), nullable=True),
        sa.Column("opened_at", sa.Float(), nullable=False),
        sa.Column("deadline_at", sa.Float(), nullable=False),
        sa.Column("closed_at", sa.Float(), nullable=True),
        sa.Column("closed_by", sa.String(length=200), nullable=True),
        sa.Column("failure_reason", sa.Text(), nullable=True),
        sa.Column("stats", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["federation_id"],
            ["federations.id"],
            name=op.f("fk_rounds_federation_id_federations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rounds")),
        sa.UniqueConstraint(
            "federation_id", "number", "attempt", name=op.f("uq_rounds_federation_id_number_attempt")
        ),
    )
    with op.batch_alter_table("rounds", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_rounds_federation_id"), ["federation_id"], unique=False)

    op.create_table(
        "evaluations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("federation_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("client_id", sa.Integer(), nullable=False),
        sa.Column("num_samples", sa.Integer(), nullable=False),
        sa.Column("accuracy", sa.Float(), nullable=False),
        sa.Column("loss", sa.Float(), nullable=True),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["client_id"], ["clients.id"], name=op.f("fk_evaluations_client_id_clients"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["federation_id"],
            ["federations.id"],
            name=op.f("fk_evaluations_federation_id_federations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_evaluations")),
        sa.UniqueConstraint(
            "federation_id",
            "version",
            "client_id",
            name=op.f("uq_evaluations_federation_id_version_client_id"),
        ),
    )
    with op.batch_alter_table("evaluations", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_evaluations_client_id"), ["client_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_evaluations_federation_id"), ["federation_id"], unique=False)

    op.create_table(
        "participants",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("round_id", sa.Integer(), nullable=False),
        sa.Column("client_id", sa.Integer(), nullable=False),
        sa.Column("downloaded_bytes", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["client_id"], ["clients.id"], name=op.f("fk_participants_client_id_clients"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["round_id"], ["rounds.id"], name=op.f("fk_participants_round_id_rounds"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_participants")),
        sa.UniqueConstraint("round_id", "client_id", name=op.f("uq_participants_round_id_client_id")),
    )
    with op.batch_alter_table("participants", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_participants_client_id"), ["client_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_participants_round_id"), ["round_id"], unique=False)

    op.create_table(
        "prompt_versions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("federation_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("round_id", sa.Integer(), nullable=True),
        sa.Column("blob", sa.LargeBinary(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["federation_id"],
            ["federations.id"],
            name=op.f("fk_prompt_versions_federation_id_federations"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["round_id"], ["rounds.id"], name=op.f("fk_prompt_versions_round_id_rounds"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_prompt_versions")),
        sa.UniqueConstraint(
            "federation_id", "version", name=op.f("uq_prompt_versions_federation_id_version")
        ),
    )
    with op.batch_alter_table("prompt_versions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_prompt_versions_federation_id"), ["federation_id"], unique=False)

    op.create_table(
        "updates",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("round_id", sa.Integer(), nullable=False),
        sa.Column("client_id", sa.Integer(), nullable=False),
        sa.Column("blob", sa.LargeBinary(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("num_samples", sa.Integer(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["client_id"], ["clients.id"], name=op.f("fk_updates_client_id_clients"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["round_id"], ["rounds.id"], name=op.f("fk_updates_round_id_rounds"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_updates")),
        sa.UniqueConstraint("round_id", "client_id", name=op.f("uq_updates_round_id_client_id")),
    )
    with op.batch_alter_table("updates", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_updates_client_id"), ["client_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_updates_round_id"), ["round_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("updates", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_updates_round_id"))
        batch_op.drop_index(batch_op.f("ix_updates_client_id"))

    op.drop_table("updates")
    with op.batch_alter_table("prompt_versions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_prompt_versions_federation_id"))

    op.drop_table("prompt_versions")
    with op.batch_alter_table("participants", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_participants_round_id"))
        batch_op.drop_index(batch_op.f("ix_participants_client_id"))

    op.drop_table("participants")
    with op.batch_alter_table("evaluations", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_evaluations_federation_id"))
        batch_op.drop_index(batch_op.f("ix_evaluations_client_id"))

    op.drop_table("evaluations")
    with op.batch_alter_table("rounds", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_rounds_federation_id"))

    op.drop_table("rounds")
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_index("ix_events_federation_id_id")

    op.drop_table("events")
    with op.batch_alter_table("enrollment_tokens", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_enrollment_tokens_federation_id"))

    op.drop_table("enrollment_tokens")
    with op.batch_alter_table("clients", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_clients_federation_id"))

    op.drop_table("clients")
    op.drop_table("federations")
