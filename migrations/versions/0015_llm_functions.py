"""LLM functions (issue 28): a version's llmInvocationConfig and telemetries, as NVCF stores
them (models[].llmConfig lives in the existing `models` JSON).

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("function_versions") as batch:
        batch.add_column(sa.Column("llm_invocation_config", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("telemetries", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("function_versions") as batch:
        batch.drop_column("telemetries")
        batch.drop_column("llm_invocation_config")
