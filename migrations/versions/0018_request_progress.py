"""Progress of polled requests (issue 29): the worker's last progress report, published by the
replica running the request, so that a poll reaching another replica shows it.

Revision ID: 0018
Revises: 0017
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("invocation_requests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("progress_percent", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("progress_partial", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("invocation_requests", schema=None) as batch_op:
        batch_op.drop_column("progress_partial")
        batch_op.drop_column("progress_percent")
