"""Secrets in the workload and the DEPLOYING status rule: the generation of a version's secrets
(bumped by every update), the generation each instance received, and how many instances each
deployment specification has tried and seen fail.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("function_versions", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("secrets_generation", sa.Integer(), nullable=False, server_default="0")
        )
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("secrets_generation", sa.Integer(), nullable=False, server_default="0")
        )
    with op.batch_alter_table("deployment_specs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("failures", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("deployment_specs", schema=None) as batch_op:
        batch_op.drop_column("failures")
        batch_op.drop_column("attempts")
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.drop_column("secrets_generation")
    with op.batch_alter_table("function_versions", schema=None) as batch_op:
        batch_op.drop_column("secrets_generation")
