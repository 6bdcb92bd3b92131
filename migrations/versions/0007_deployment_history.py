"""Deployment history: a removed deployment's timeline and failed instances stay readable.

`deployment_events` loses its foreign key (the timeline outlives the deployment row) and
`deployment_history` keeps one row per removed deployment until it expires. Existing rows are
kept as they are.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_FK = "fk_deployment_events_deployment_id_deployments"


def upgrade() -> None:
    op.create_table(
        "deployment_history",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("account_id", sa.String(length=128), nullable=False),
        sa.Column("function_id", sa.String(length=36), nullable=False),
        sa.Column("version_id", sa.String(length=36), nullable=False),
        sa.Column("function_name", sa.String(length=128), nullable=False),
        sa.Column("specifications", sa.JSON(), nullable=False),
        sa.Column("failed_instances", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("removed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deployment_history")),
    )
    with op.batch_alter_table("deployment_history", schema=None) as batch_op:
        batch_op.create_index("ix_deployment_history_expires_at", ["expires_at"], unique=False)
        batch_op.create_index(
            "ix_deployment_history_account_version",
            ["account_id", "version_id", "created_at", "id"],
            unique=False,
        )
    # SQLite: the table is copied into a new one without the constraint (rows and the
    # deployment_id index are kept); PostgreSQL: the constraint is dropped in place.
    with op.batch_alter_table("deployment_events", schema=None) as batch_op:
        batch_op.drop_constraint(_FK, type_="foreignkey")


def downgrade() -> None:
    # The timelines of removed deployments cannot satisfy the foreign key again: they go
    # with the history.
    op.execute(
        "DELETE FROM deployment_events WHERE deployment_id NOT IN (SELECT id FROM deployments)"
    )
    with op.batch_alter_table("deployment_events", schema=None) as batch_op:
        batch_op.create_foreign_key(
            _FK, "deployments", ["deployment_id"], ["id"], ondelete="CASCADE"
        )
    with op.batch_alter_table("deployment_history", schema=None) as batch_op:
        batch_op.drop_index("ix_deployment_history_account_version")
        batch_op.drop_index("ix_deployment_history_expires_at")
    op.drop_table("deployment_history")
