"""A function's traffic split: each version's weight among the invocations naming no version.

Revision ID: 0023
Revises: 0022
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "function_traffic",
        sa.Column("function_id", sa.String(length=36), nullable=False),
        sa.Column("version_id", sa.String(length=36), nullable=False),
        sa.Column("weight", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["function_id"],
            ["functions.id"],
            name=op.f("fk_function_traffic_function_id_functions"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["version_id"],
            ["function_versions.id"],
            name=op.f("fk_function_traffic_version_id_function_versions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("function_id", "version_id", name=op.f("pk_function_traffic")),
    )


def downgrade() -> None:
    op.drop_table("function_traffic")
