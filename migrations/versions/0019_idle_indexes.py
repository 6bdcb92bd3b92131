"""Indexes for the periodic reads of a settled fleet (issue 32): the time series' versions
whose instances were written (`instances.updated_at`) or whose deployment was removed
(`deployment_history.removed_at`) since its previous sample, and the autoscaler's specs held
above their minimum (a partial index of those only). Each was a table scan every period.

Revision ID: 0019
Revises: 0018
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

ABOVE_MINIMUM = "target_instances IS NOT NULL AND target_instances > min_instances"


def upgrade() -> None:
    op.create_index("ix_instances_updated_at", "instances", ["updated_at"], unique=False)
    op.create_index(
        "ix_deployment_history_removed_at", "deployment_history", ["removed_at"], unique=False
    )
    op.create_index(
        "ix_deployment_specs_above_minimum",
        "deployment_specs",
        ["deployment_id"],
        unique=False,
        sqlite_where=sa.text(ABOVE_MINIMUM),
        postgresql_where=sa.text(ABOVE_MINIMUM),
    )


def downgrade() -> None:
    op.drop_index("ix_deployment_specs_above_minimum", table_name="deployment_specs")
    op.drop_index("ix_deployment_history_removed_at", table_name="deployment_history")
    op.drop_index("ix_instances_updated_at", table_name="instances")
