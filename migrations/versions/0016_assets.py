"""Assets (issue 29): one row per asset an account created; the bytes live in the object store.

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "assets",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("account_id", sa.String(length=128), nullable=False),
        sa.Column("content_type", sa.String(length=255), nullable=False),
        sa.Column("description", sa.String(length=1024), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.Column("uploaded_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_assets")),
    )
    op.create_index(
        "ix_assets_account_created", "assets", ["account_id", "created_at", "id"], unique=False
    )
    op.create_index("ix_assets_expires", "assets", ["expires_at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_assets_expires", table_name="assets")
    op.drop_index("ix_assets_account_created", table_name="assets")
    op.drop_table("assets")
