"""Metering: each instance's (or task's) GPU interval, and invocation and token counts per
replica run, hour, account, function, version and model.

Revision ID: 0027
Revises: 0026
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gpu_intervals",
        sa.Column("instance_id", sa.String(36), primary_key=True),
        sa.Column("account_id", sa.String(128), nullable=False),
        sa.Column("function_id", sa.String(36)),
        sa.Column("version_id", sa.String(36)),
        sa.Column("deployment_id", sa.String(36)),
        sa.Column("task_id", sa.String(36)),
        sa.Column("gpu", sa.String(64), nullable=False),
        sa.Column("instance_type", sa.String(128), nullable=False),
        sa.Column("cluster", sa.String(128)),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True)),
        sa.Column("ended_at", sa.DateTime(timezone=True)),
    )
    op.create_index(
        "ix_gpu_intervals_account_created", "gpu_intervals", ["account_id", "created_at"]
    )
    op.create_index("ix_gpu_intervals_deployment", "gpu_intervals", ["deployment_id"])
    op.create_table(
        "usage_counts",
        sa.Column("replica", sa.String(36), nullable=False),
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("account_id", sa.String(128), nullable=False),
        sa.Column("function_id", sa.String(36), nullable=False),
        sa.Column("version_id", sa.String(36), nullable=False),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("invocations", sa.BigInteger(), nullable=False),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("batch", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint(
            "replica", "hour", "account_id", "function_id", "version_id", "model"
        ),
    )
    op.create_index("ix_usage_counts_account_hour", "usage_counts", ["account_id", "hour"])


def downgrade() -> None:
    op.drop_index("ix_usage_counts_account_hour", "usage_counts")
    op.drop_table("usage_counts")
    op.drop_index("ix_gpu_intervals_deployment", "gpu_intervals")
    op.drop_index("ix_gpu_intervals_account_created", "gpu_intervals")
    op.drop_table("gpu_intervals")
