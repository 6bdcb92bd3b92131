"""The last lines of failed instances' containers (service/deployments/models.py: KeptLog).

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "instance_last_logs",
        sa.Column("instance_id", sa.String(length=36), nullable=False),
        sa.Column("deployment_id", sa.String(length=36), nullable=False),
        sa.Column("account_id", sa.String(length=128), nullable=False),
        sa.Column("captured_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("containers", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("instance_id", name=op.f("pk_instance_last_logs")),
    )
    op.create_index(
        op.f("ix_instance_last_logs_deployment_id"),
        "instance_last_logs",
        ["deployment_id"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_instance_last_logs_deployment_id"), table_name="instance_last_logs")
    op.drop_table("instance_last_logs")
