"""site health: what each client last said it was doing (its training heartbeat)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03 04:20:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("clients", schema=None) as batch_op:
        batch_op.add_column(sa.Column("activity", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("clients", schema=None) as batch_op:
        batch_op.drop_column("activity")
