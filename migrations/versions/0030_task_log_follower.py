"""Who follows a task's lines for its telemetry (one replica at a time), until when, and the
last line it sent: another replica carries on from there once the lease ends.

Revision ID: 0030
Revises: 0029
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("log_follower", sa.String(64), nullable=True))
        batch.add_column(sa.Column("log_follower_until", sa.DateTime(timezone=True)))
        batch.add_column(sa.Column("log_sent", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("log_sent")
        batch.drop_column("log_follower_until")
        batch.drop_column("log_follower")
