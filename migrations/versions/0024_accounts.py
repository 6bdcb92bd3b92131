"""Accounts as the operator manages them: a name, admin client ids, limits of their own and a
suspension, which holds the account's deployments at zero instances.

Revision ID: 0024
Revises: 0023
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("accounts") as batch:
        batch.add_column(sa.Column("name", sa.String(256), nullable=True))
        batch.add_column(sa.Column("admin_client_ids", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("limits", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("suspended_reason", sa.Text(), nullable=True))
        batch.add_column(sa.Column("suspended_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("deployment_specs") as batch:
        batch.add_column(
            sa.Column("held", sa.Boolean(), nullable=False, server_default=sa.text("false"))
        )


def downgrade() -> None:
    with op.batch_alter_table("deployment_specs") as batch:
        batch.drop_column("held")
    with op.batch_alter_table("accounts") as batch:
        for column in ("suspended_at", "suspended_reason", "limits", "admin_client_ids", "name"):
            batch.drop_column(column)
