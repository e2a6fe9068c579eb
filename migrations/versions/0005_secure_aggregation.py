"""secure aggregation: round plans and stage messages

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02 12:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "secagg_rounds",
        sa.Column("round_id", sa.Integer(), nullable=False),
        sa.Column("stage", sa.String(length=16), nullable=False),
        sa.Column("plan", sa.JSON(), nullable=False),
        sa.Column("reached", sa.JSON(), nullable=False),
        sa.Column("stage_started_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["round_id"], ["rounds.id"], name=op.f("fk_secagg_rounds_round_id_rounds"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("round_id", name=op.f("pk_secagg_rounds")),
    )
    op.create_table(
        "secagg_messages",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("round_id", sa.Integer(), nullable=False),
        sa.Column("stage", sa.String(length=16), nullable=False),
        sa.Column("sender_id", sa.Integer(), nullable=False),
        sa.Column("recipient_id", sa.Integer(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["round_id"], ["rounds.id"], name=op.f("fk_secagg_messages_round_id_rounds"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["sender_id"],
            ["clients.id"],
            name=op.f("fk_secagg_messages_sender_id_clients"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_secagg_messages")),
        sa.UniqueConstraint(
            "round_id",
            "stage",
            "sender_id",
            "recipient_id",
            name=op.f("uq_secagg_messages_round_id_stage_sender_id_recipient_id"),
        ),
    )
    with op.batch_alter_table("secagg_messages", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_secagg_messages_round_id"), ["round_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_secagg_messages_sender_id"), ["sender_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("secagg_messages", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_secagg_messages_sender_id"))
        batch_op.drop_index(batch_op.f("ix_secagg_messages_round_id"))
    op.drop_table("secagg_messages")
    op.drop_table("secagg_rounds")
