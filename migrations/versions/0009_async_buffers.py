"""mode async (FedBuff): when each task was handed out, and which buffer counts each update

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04 14:10:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("participants", schema=None) as batch_op:
        batch_op.add_column(sa.Column("dispatched_at", sa.Float(), nullable=True))
    with op.batch_alter_table("updates", schema=None) as batch_op:
        batch_op.add_column(sa.Column("buffer_round_id", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("staleness", sa.Integer(), nullable=True))
        batch_op.create_index(batch_op.f("ix_updates_buffer_round_id"), ["buffer_round_id"], unique=False)
        batch_op.create_foreign_key(
            batch_op.f("fk_updates_buffer_round_id_rounds"),
            "rounds",
            ["buffer_round_id"],
            ["id"],
            ondelete="CASCADE",
        )


def downgrade() -> None:
    with op.batch_alter_table("updates", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("fk_updates_buffer_round_id_rounds"), type_="foreignkey")
        batch_op.drop_index(batch_op.f("ix_updates_buffer_round_id"))
        batch_op.drop_column("staleness")
        batch_op.drop_column("buffer_round_id")
    with op.batch_alter_table("participants", schema=None) as batch_op:
        batch_op.drop_column("dispatched_at")
