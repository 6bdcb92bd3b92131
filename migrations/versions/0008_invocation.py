"""Invocation: requests a client may poll (state, result or error) and the replicas that run
them (heartbeats).

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "invocation_requests",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("account_id", sa.String(length=128), nullable=False),
        sa.Column("function_id", sa.String(length=36), nullable=False),
        sa.Column("version_id", sa.String(length=36), nullable=False),
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("result_status", sa.Integer(), nullable=True),
        sa.Column("result_headers", sa.JSON(), nullable=True),
        sa.Column("result_body", sa.LargeBinary(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("error_status", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_invocation_requests")),
    )
    op.create_index("ix_invocation_requests_owner_state", "invocation_requests", ["owner", "state"])
    op.create_index("ix_invocation_requests_expires_at", "invocation_requests", ["expires_at"])
    op.create_index(
        op.f("ix_invocation_requests_version_id"), "invocation_requests", ["version_id"]
    )
    op.create_table(
        "invocation_replicas",
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("owner", name=op.f("pk_invocation_replicas")),
    )


def downgrade() -> None:
    op.drop_table("invocation_replicas")
    op.drop_index(op.f("ix_invocation_requests_version_id"), table_name="invocation_requests")
    op.drop_index("ix_invocation_requests_expires_at", table_name="invocation_requests")
    op.drop_index("ix_invocation_requests_owner_state", table_name="invocation_requests")
    op.drop_table("invocation_requests")
