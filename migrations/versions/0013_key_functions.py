"""API keys limited to named functions, and NVCF's `authorizations` of keys created through
`POST /v1/keys` (service/auth/nvcf_keys.py).

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("functions", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("authorizations", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("authorizations")
        batch.drop_column("functions")
