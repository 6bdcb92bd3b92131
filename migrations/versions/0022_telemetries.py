"""Telemetry endpoints (NVCF's bring-your-own-observability): the account's receivers of its
functions' logs, metrics and traces, their keys encrypted, and the last outcome of an export.

Revision ID: 0022
Revises: 0021
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "telemetries",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("account_id", sa.String(128), nullable=False),
        sa.Column("name", sa.String(48), nullable=False),
        sa.Column("endpoint", sa.String(2048), nullable=False),
        sa.Column("protocol", sa.String(8), nullable=False),
        sa.Column("provider", sa.String(32), nullable=False),
        sa.Column("types", sa.JSON(), nullable=False),
        sa.Column("secret_ciphertext", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_success_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.String(512), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_telemetries")),
        sa.UniqueConstraint("account_id", "name", name="uq_telemetries_account_name"),
    )
    op.create_index(
        "ix_telemetries_account_created", "telemetries", ["account_id", "created_at", "id"]
    )


def downgrade() -> None:
    op.drop_index("ix_telemetries_account_created", table_name="telemetries")
    op.drop_table("telemetries")
