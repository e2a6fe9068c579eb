"""secure aggregation: each client's pinned Ed25519 signing key

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02 23:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("clients", schema=None) as batch_op:
        batch_op.add_column(sa.Column("signing_key", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("clients", schema=None) as batch_op:
        batch_op.drop_column("signing_key")
