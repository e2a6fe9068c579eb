"""server optimizer states

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 15:28:36.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "server_optimizer_states",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("federation_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("optimizer", sa.String(length=32), nullable=False),
        sa.Column("blob", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["federation_id"],
            ["federations.id"],
            name=op.f("fk_server_optimizer_states_federation_id_federations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_server_optimizer_states")),
        sa.UniqueConstraint(
            "federation_id", "version", name=op.f("uq_server_optimizer_states_federation_id_version")
        ),
    )


def downgrade() -> None:
    op.drop_table("server_optimizer_states")
