"""Due times: the reconciler reads what is due instead of scanning every row.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.add_column(sa.Column("due_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.create_index("ix_deployments_due_at", ["due_at"], unique=False)
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.add_column(sa.Column("due_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.create_index("ix_instances_due_at", ["due_at"], unique=False)
    # Everything that exists is looked at once after the upgrade, then scheduled as usual.
    op.execute("UPDATE deployments SET due_at = CURRENT_TIMESTAMP")
    op.execute(
        "UPDATE instances SET due_at = CURRENT_TIMESTAMP WHERE desired = 'present' OR applied"
    )


def downgrade() -> None:
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.drop_index("ix_instances_due_at")
        batch_op.drop_column("due_at")
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.drop_index("ix_deployments_due_at")
        batch_op.drop_column("due_at")
