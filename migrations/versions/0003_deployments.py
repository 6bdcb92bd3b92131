"""Deployments, GPU specifications, instances and the event timeline.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table(
        "deployments",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("account_id", sa.String(length=128), nullable=False),
        sa.Column("function_id", sa.String(length=36), nullable=False),
        sa.Column("version_id", sa.String(length=36), nullable=False),
        sa.Column("function_name", sa.String(length=128), nullable=False),
        sa.Column("desired", sa.String(length=16), nullable=False),
        sa.Column("feature_flags", sa.JSON(), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deployments")),
    )
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.create_index(
            "ix_deployments_account_created", ["account_id", "created_at", "id"], unique=False
        )
        batch_op.create_index(
            batch_op.f("ix_deployments_function_id"), ["function_id"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_deployments_version_id"), ["version_id"], unique=False)
        batch_op.create_index(
            "uq_deployments_live_version",
            ["version_id"],
            unique=True,
            sqlite_where=sa.text("desired = 'deployed'"),
            postgresql_where=sa.text("desired = 'deployed'"),
        )

    op.create_table(
        "deployment_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("deployment_id", sa.String(length=36), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("instance_id", sa.String(length=36), nullable=True),
        sa.Column("phase", sa.String(length=32), nullable=True),
        sa.Column("reason", sa.String(length=64), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["deployment_id"],
            ["deployments.id"],
            name=op.f("fk_deployment_events_deployment_id_deployments"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deployment_events")),
    )
    with op.batch_alter_table("deployment_events", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_deployment_events_deployment_id"), ["deployment_id"], unique=False
        )

    op.create_table(
        "deployment_specs",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("deployment_id", sa.String(length=36), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("gpu", sa.String(length=64), nullable=False),
        sa.Column("instance_type", sa.String(length=128), nullable=False),
        sa.Column("backend", sa.String(length=128), nullable=False),
        sa.Column("clusters", sa.JSON(), nullable=True),
        sa.Column("regions", sa.JSON(), nullable=True),
        sa.Column("attributes", sa.JSON(), nullable=True),
        sa.Column("availability_zones", sa.JSON(), nullable=True),
        sa.Column("candidate_clusters", sa.JSON(), nullable=False),
        sa.Column("min_instances", sa.Integer(), nullable=False),
        sa.Column("max_instances", sa.Integer(), nullable=False),
        sa.Column("max_request_concurrency", sa.Integer(), nullable=False),
        sa.Column("preferred_order", sa.Integer(), nullable=False),
        sa.Column("configuration", sa.JSON(), nullable=True),
        sa.Column("helm_validation_policy", sa.JSON(), nullable=True),
        sa.Column("objects", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["deployment_id"],
            ["deployments.id"],
            name=op.f("fk_deployment_specs_deployment_id_deployments"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deployment_specs")),
    )
    with op.batch_alter_table("deployment_specs", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_deployment_specs_deployment_id"), ["deployment_id"], unique=False
        )

    op.create_table(
        "instances",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("deployment_id", sa.String(length=36), nullable=False),
        sa.Column("spec_id", sa.String(length=36), nullable=False),
        sa.Column("account_id", sa.String(length=128), nullable=False),
        sa.Column("cluster", sa.String(length=128), nullable=True),
        sa.Column("desired", sa.String(length=16), nullable=False),
        sa.Column("applied", sa.Boolean(), nullable=False),
        sa.Column("phase", sa.String(length=32), nullable=False),
        sa.Column("reason", sa.String(length=64), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
        sa.Column("condition", sa.JSON(), nullable=True),
        sa.Column("lease_owner", sa.String(length=64), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["deployment_id"],
            ["deployments.id"],
            name=op.f("fk_instances_deployment_id_deployments"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["spec_id"],
            ["deployment_specs.id"],
            name=op.f("fk_instances_spec_id_deployment_specs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_instances")),
    )
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_instances_deployment_id"), ["deployment_id"], unique=False
        )
        batch_op.create_index(
            "ix_instances_desired_lease", ["desired", "lease_expires_at"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_instances_spec_id"), ["spec_id"], unique=False)


def downgrade() -> None:

    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_instances_spec_id"))
        batch_op.drop_index("ix_instances_desired_lease")
        batch_op.drop_index(batch_op.f("ix_instances_deployment_id"))

    op.drop_table("instances")
    with op.batch_alter_table("deployment_specs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_deployment_specs_deployment_id"))

    op.drop_table("deployment_specs")
    with op.batch_alter_table("deployment_events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_deployment_events_deployment_id"))

    op.drop_table("deployment_events")
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.drop_index(
            "uq_deployments_live_version",
            sqlite_where=sa.text("desired = 'deployed'"),
            postgresql_where=sa.text("desired = 'deployed'"),
        )
        batch_op.drop_index(batch_op.f("ix_deployments_version_id"))
        batch_op.drop_index(batch_op.f("ix_deployments_function_id"))
        batch_op.drop_index("ix_deployments_account_created")

    op.drop_table("deployments")
