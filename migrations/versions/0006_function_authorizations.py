"""Functions shared with other accounts (NVCF's authorized parties).

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "function_authorizations",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("function_id", sa.String(length=36), nullable=False),
        sa.Column("version_id", sa.String(length=36), nullable=True),
        sa.Column("account_id", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["function_id"],
            ["functions.id"],
            name=op.f("fk_function_authorizations_function_id_functions"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["version_id"],
            ["function_versions.id"],
            name=op.f("fk_function_authorizations_version_id_function_versions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_function_authorizations")),
    )
    with op.batch_alter_table("function_authorizations", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_function_authorizations_account_id"), ["account_id"], unique=False
        )
        batch_op.create_index(
            batch_op.f("ix_function_authorizations_function_id"), ["function_id"], unique=False
        )
        batch_op.create_index(
            "uq_function_authorizations_function",
            ["function_id", "account_id"],
            unique=True,
            sqlite_where=sa.text("version_id IS NULL"),
            postgresql_where=sa.text("version_id IS NULL"),
        )
        batch_op.create_index(
            "uq_function_authorizations_version",
            ["version_id", "account_id"],
            unique=True,
            sqlite_where=sa.text("version_id IS NOT NULL"),
            postgresql_where=sa.text("version_id IS NOT NULL"),
        )


def downgrade() -> None:
    with op.batch_alter_table("function_authorizations", schema=None) as batch_op:
        batch_op.drop_index(
            "uq_function_authorizations_version",
            sqlite_where=sa.text("version_id IS NOT NULL"),
            postgresql_where=sa.text("version_id IS NOT NULL"),
        )
        batch_op.drop_index(
            "uq_function_authorizations_function",
            sqlite_where=sa.text("version_id IS NULL"),
            postgresql_where=sa.text("version_id IS NULL"),
        )
        batch_op.drop_index(batch_op.f("ix_function_authorizations_function_id"))
        batch_op.drop_index(batch_op.f("ix_function_authorizations_account_id"))

    op.drop_table("function_authorizations")
