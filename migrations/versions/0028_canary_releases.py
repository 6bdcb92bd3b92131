"""Canary releases of a function's versions and the figures each replica measured per step;
a GPU specification's share of its function's traffic (its minInstances count in proportion).

Revision ID: 0028
Revises: 0027
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("deployment_specs") as batch:
        batch.add_column(
            sa.Column("traffic_share", sa.Integer(), server_default="100", nullable=False)
        )
    op.create_table(
        "canary_releases",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("function_id", sa.String(length=36), nullable=False),
        sa.Column("active_function_id", sa.String(length=36), nullable=True),
        sa.Column("canary_version_id", sa.String(length=36), nullable=False),
        sa.Column("stable_version_id", sa.String(length=36), nullable=False),
        sa.Column("plan", sa.JSON(), nullable=False),
        sa.Column("undeploy_on_rollback", sa.Boolean(), nullable=False),
        sa.Column("phase", sa.String(length=16), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("step_started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("analysis", sa.JSON(), nullable=True),
        sa.Column("created_by", sa.String(length=200), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["function_id"],
            ["functions.id"],
            name=op.f("fk_canary_releases_function_id_functions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_canary_releases")),
        sa.UniqueConstraint(
            "active_function_id", name=op.f("uq_canary_releases_active_function_id")
        ),
    )
    op.create_index(
        op.f("ix_canary_releases_function_id"), "canary_releases", ["function_id"], unique=False
    )
    op.create_table(
        "canary_figures",
        sa.Column("release_id", sa.String(length=36), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("version_id", sa.String(length=36), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("errors", sa.Integer(), nullable=False),
        sa.Column("latency", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["release_id"],
            ["canary_releases.id"],
            name=op.f("fk_canary_figures_release_id_canary_releases"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "release_id", "step", "owner", "version_id", name=op.f("pk_canary_figures")
        ),
    )


def downgrade() -> None:
    op.drop_table("canary_figures")
    op.drop_index(op.f("ix_canary_releases_function_id"), table_name="canary_releases")
    op.drop_table("canary_releases")
    with op.batch_alter_table("deployment_specs") as batch:
        batch.drop_column("traffic_share")
