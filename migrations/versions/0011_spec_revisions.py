"""Spec revisions, rollouts and drain.

`deployment_spec_revisions` keeps every accepted configuration of a GPU specification as a
numbered revision with its validated objects (revision 1 of every existing spec is its
deployed configuration); specs get their current and target revision and the last rollout's
outcome; instances record the revision they run and when they started draining; deployments
record when a graceful undeploy started draining.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "deployment_spec_revisions",
        sa.Column("spec_id", sa.String(length=36), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("configuration", sa.JSON(), nullable=True),
        sa.Column("helm_validation_policy", sa.JSON(), nullable=True),
        sa.Column("objects", sa.JSON(), nullable=False),
        sa.Column("created_by", sa.String(length=200), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["spec_id"],
            ["deployment_specs.id"],
            name=op.f("fk_deployment_spec_revisions_spec_id_deployment_specs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("spec_id", "number", name=op.f("pk_deployment_spec_revisions")),
    )
    with op.batch_alter_table("deployment_specs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("revision", sa.Integer(), server_default="1", nullable=False))
        batch_op.add_column(
            sa.Column("target_revision", sa.Integer(), server_default="1", nullable=False)
        )
        batch_op.add_column(sa.Column("rollout_state", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("rollout_reason", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("rollout_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.add_column(sa.Column("revision", sa.Integer(), server_default="1", nullable=False))
        batch_op.add_column(sa.Column("drain_since", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.add_column(sa.Column("drain_since", sa.DateTime(timezone=True), nullable=True))
    # Revision 1 of every existing specification: what it was deployed with.
    op.execute(
        "INSERT INTO deployment_spec_revisions (spec_id, number, configuration, "
        "helm_validation_policy, objects, created_by, created_at) "
        "SELECT s.id, 1, s.configuration, s.helm_validation_policy, s.objects, NULL, "
        "d.created_at FROM deployment_specs s JOIN deployments d ON d.id = s.deployment_id"
    )


def downgrade() -> None:
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.drop_column("drain_since")
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.drop_column("drain_since")
        batch_op.drop_column("revision")
    with op.batch_alter_table("deployment_specs", schema=None) as batch_op:
        batch_op.drop_column("rollout_at")
        batch_op.drop_column("rollout_reason")
        batch_op.drop_column("rollout_state")
        batch_op.drop_column("target_revision")
        batch_op.drop_column("revision")
    op.drop_table("deployment_spec_revisions")
