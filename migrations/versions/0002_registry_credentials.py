"""Registry credentials per account (api.md §5); passwords stored encrypted.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "registry_credentials",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("account_id", sa.String(length=128), nullable=False),
        sa.Column("registry_hostname", sa.String(length=260), nullable=False),
        sa.Column("username", sa.String(length=255), nullable=False),
        sa.Column("password_ciphertext", sa.Text(), nullable=False),
        sa.Column("description", sa.String(length=256), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_registry_credentials")),
        sa.UniqueConstraint(
            "account_id",
            "registry_hostname",
            "username",
            name="uq_registry_credentials_account_host_user",
        ),
    )
    with op.batch_alter_table("registry_credentials", schema=None) as batch_op:
        batch_op.create_index(
            "ix_registry_credentials_account_created",
            ["account_id", "created_at", "id"],
            unique=False,
        )


def downgrade() -> None:
    with op.batch_alter_table("registry_credentials", schema=None) as batch_op:
        batch_op.drop_index("ix_registry_credentials_account_created")

    op.drop_table("registry_credentials")
