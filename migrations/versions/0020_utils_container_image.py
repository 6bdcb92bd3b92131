"""A function version's `utilsContainerImage` (NVCF's): the image of its worker-utilities
sidecar on Kubernetes, or NVCF's selectors of the platform's own.

Revision ID: 0020
Revises: 0019
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("function_versions") as batch:
        batch.add_column(sa.Column("utils_container_image", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("function_versions") as batch:
        batch.drop_column("utils_container_image")
