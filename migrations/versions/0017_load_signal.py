"""The autoscaler's load signal belongs to deployments (issue 31): when a replica last reported
its load moves from `invocation_replicas.load_reported_at` to its own table, `load_reporters`,
beside the `invocation_load` rows it dates.

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "load_reporters",
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("reported_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("owner", name=op.f("pk_load_reporters")),
    )
    op.execute(
        "INSERT INTO load_reporters (owner, reported_at) SELECT owner, load_reported_at "
        "FROM invocation_replicas WHERE load_reported_at IS NOT NULL"
    )
    with op.batch_alter_table("invocation_replicas") as batch:
        batch.drop_column("load_reported_at")


def downgrade() -> None:
    with op.batch_alter_table("invocation_replicas") as batch:
        batch.add_column(sa.Column("load_reported_at", sa.DateTime(timezone=True), nullable=True))
    op.execute(
        "UPDATE invocation_replicas SET load_reported_at = (SELECT reported_at FROM "
        "load_reporters WHERE load_reporters.owner = invocation_replicas.owner)"
    )
    op.drop_table("load_reporters")
