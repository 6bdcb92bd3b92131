"""The function registry: accounts, API keys, functions, versions, tags, secrets, idempotency.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table(
        "accounts",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_accounts")),
    )
    op.create_table(
        "functions",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("account_id", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_functions")),
    )
    with op.batch_alter_table("functions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_functions_account_id"), ["account_id"], unique=False)

    op.create_table(
        "idempotency_records",
        sa.Column("account_id", sa.String(length=128), nullable=False),
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("response", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("account_id", "key", name=op.f("pk_idempotency_records")),
    )
    with op.batch_alter_table("idempotency_records", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_idempotency_records_created_at"), ["created_at"], unique=False
        )

    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("account_id", sa.String(length=128), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("hint", sa.String(length=32), nullable=False),
        sa.Column("scopes", sa.JSON(), nullable=False),
        sa.Column("description", sa.String(length=256), nullable=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"],
            ["accounts.id"],
            name=op.f("fk_api_keys_account_id_accounts"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_api_keys_key_hash")),
    )
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_api_keys_account_id"), ["account_id"], unique=False)

    op.create_table(
        "function_versions",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("function_id", sa.String(length=36), nullable=False),
        sa.Column("account_id", sa.String(length=128), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("inference_url", sa.Text(), nullable=False),
        sa.Column("inference_port", sa.Integer(), nullable=True),
        sa.Column("container_image", sa.Text(), nullable=True),
        sa.Column("container_args", sa.Text(), nullable=True),
        sa.Column("container_environment", sa.JSON(), nullable=True),
        sa.Column("helm_chart", sa.Text(), nullable=True),
        sa.Column("helm_chart_service_name", sa.String(length=63), nullable=True),
        sa.Column("helm_chart_digest", sa.String(length=80), nullable=True),
        sa.Column("models", sa.JSON(), nullable=True),
        sa.Column("resources", sa.JSON(), nullable=True),
        sa.Column("api_body_format", sa.String(length=16), nullable=False),
        sa.Column("function_type", sa.String(length=16), nullable=False),
        sa.Column("health", sa.JSON(), nullable=False),
        sa.Column("health_uri", sa.Text(), nullable=True),
        sa.Column("description", sa.String(length=256), nullable=False),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("rate_limit", sa.JSON(), nullable=True),
        sa.Column("findings", sa.JSON(), nullable=True),
        sa.Column("secret_names", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["function_id"],
            ["functions.id"],
            name=op.f("fk_function_versions_function_id_functions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_function_versions")),
    )
    with op.batch_alter_table("function_versions", schema=None) as batch_op:
        batch_op.create_index(
            "ix_function_versions_account_created", ["account_id", "created_at", "id"], unique=False
        )
        batch_op.create_index(
            batch_op.f("ix_function_versions_function_id"), ["function_id"], unique=False
        )

    op.create_table(
        "function_secrets",
        sa.Column("version_id", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=48), nullable=False),
        sa.Column("ciphertext", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["version_id"],
            ["function_versions.id"],
            name=op.f("fk_function_secrets_version_id_function_versions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("version_id", "name", name=op.f("pk_function_secrets")),
    )
    op.create_table(
        "version_tags",
        sa.Column("version_id", sa.String(length=36), nullable=False),
        sa.Column("tag", sa.String(length=128), nullable=False),
        sa.ForeignKeyConstraint(
            ["version_id"],
            ["function_versions.id"],
            name=op.f("fk_version_tags_version_id_function_versions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("version_id", "tag", name=op.f("pk_version_tags")),
    )
    with op.batch_alter_table("version_tags", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_version_tags_tag"), ["tag"], unique=False)


def downgrade() -> None:

    with op.batch_alter_table("version_tags", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_version_tags_tag"))

    op.drop_table("version_tags")
    op.drop_table("function_secrets")
    with op.batch_alter_table("function_versions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_function_versions_function_id"))
        batch_op.drop_index("ix_function_versions_account_created")

    op.drop_table("function_versions")
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_api_keys_account_id"))

    op.drop_table("api_keys")
    with op.batch_alter_table("idempotency_records", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_idempotency_records_created_at"))

    op.drop_table("idempotency_records")
    with op.batch_alter_table("functions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_functions_account_id"))

    op.drop_table("functions")
    op.drop_table("accounts")
