"""The instances quota's count as a maintained aggregate (issue 32).

`account_instances` holds, per account, the maxInstances summed over its live deployments;
filled here from the existing deployments, then maintained by the deploy, rescale and undeploy
transitions.

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "account_instances",
        sa.Column("account_id", sa.String(length=128), nullable=False),
        sa.Column("deployed", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("account_id", name=op.f("pk_account_instances")),
    )
    op.execute(
        "INSERT INTO account_instances (account_id, deployed) "
        "SELECT d.account_id, SUM(s.max_instances) FROM deployment_specs s "
        "JOIN deployments d ON d.id = s.deployment_id WHERE d.desired = 'deployed' "
        "GROUP BY d.account_id"
    )


def downgrade() -> None:
    op.drop_table("account_instances")
