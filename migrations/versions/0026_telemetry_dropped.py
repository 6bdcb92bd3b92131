"""A telemetry's count of signals not delivered to it (its export status, shown in the console).

Revision ID: 0026
Revises: 0025
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("telemetries") as batch:
        batch.add_column(
            sa.Column("dropped", sa.BigInteger(), nullable=False, server_default=sa.text("0"))
        )


def downgrade() -> None:
    with op.batch_alter_table("telemetries") as batch:
        batch.drop_column("dropped")
