"""Autoscaling: a desired instance count and an autoscaling configuration per GPU
specification, the autoscaler's state per deployment, and the per-version load each
invocation replica publishes (with when it last published).

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("deployment_specs") as batch:
        batch.add_column(sa.Column("target_instances", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("autoscaling_policy", sa.String(length=32), nullable=True))
        batch.add_column(sa.Column("autoscaling_configuration", sa.JSON(), nullable=True))
    op.create_table(
        "autoscale_state",
        sa.Column("deployment_id", sa.String(length=36), nullable=False),
        sa.Column("version_id", sa.String(length=36), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("state", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("deployment_id", name=op.f("pk_autoscale_state")),
    )
    op.create_table(
        "invocation_load",
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("version_id", sa.String(length=36), nullable=False),
        sa.Column("in_flight", sa.Float(), nullable=False),
        sa.Column("waiting", sa.Integer(), nullable=False),
        sa.Column("last_request_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("sampled_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("owner", "version_id", name=op.f("pk_invocation_load")),
    )
    op.create_index("ix_invocation_load_version_id", "invocation_load", ["version_id"])
    with op.batch_alter_table("invocation_replicas") as batch:
        batch.add_column(sa.Column("load_reported_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("invocation_replicas") as batch:
        batch.drop_column("load_reported_at")
    op.drop_index("ix_invocation_load_version_id", table_name="invocation_load")
    op.drop_table("invocation_load")
    op.drop_table("autoscale_state")
    with op.batch_alter_table("deployment_specs") as batch:
        batch.drop_column("autoscaling_configuration")
        batch.drop_column("autoscaling_policy")
        batch.drop_column("target_instances")
