"""Cloud tasks (NVCT): tasks, their events and their results.

Revision ID: 0021
Revises: 0020
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tasks",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("account_id", sa.String(128), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("status", sa.String(40), nullable=False),
        sa.Column("description", sa.String(256)),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("gpu", sa.String(64), nullable=False),
        sa.Column("instance_type", sa.String(128), nullable=False),
        sa.Column("backend", sa.String(128)),
        sa.Column("clusters", sa.JSON()),
        sa.Column("candidate_clusters", sa.JSON(), nullable=False),
        sa.Column("configuration", sa.JSON()),
        sa.Column("container_image", sa.Text()),
        sa.Column("container_args", sa.Text()),
        sa.Column("container_environment", sa.JSON()),
        sa.Column("models", sa.JSON()),
        sa.Column("resources", sa.JSON()),
        sa.Column("helm_chart", sa.Text()),
        sa.Column("objects", sa.JSON()),
        sa.Column("result_handling", sa.String(16), nullable=False),
        sa.Column("results_location", sa.String(512)),
        sa.Column("max_runtime_seconds", sa.Float()),
        sa.Column("max_queued_seconds", sa.Float(), nullable=False),
        sa.Column("grace_seconds", sa.Float(), nullable=False),
        sa.Column("telemetries", sa.JSON()),
        sa.Column("secret_names", sa.JSON(), nullable=False),
        sa.Column("secrets_ciphertext", sa.Text()),
        sa.Column("secrets_generation", sa.Integer(), nullable=False),
        sa.Column("secrets_delivered", sa.Integer(), nullable=False),
        sa.Column("cluster", sa.String(128)),
        sa.Column("percent_complete", sa.Integer()),
        sa.Column("result_name", sa.String(190)),
        sa.Column("progress_metadata", sa.JSON()),
        sa.Column("last_heartbeat_at", sa.DateTime(timezone=True)),
        sa.Column("health_error", sa.Text()),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("launched_at", sa.DateTime(timezone=True)),
        sa.Column("running_at", sa.DateTime(timezone=True)),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.Column("stop_requested_at", sa.DateTime(timezone=True)),
        sa.Column("kill_at", sa.DateTime(timezone=True)),
        sa.Column("deleted", sa.Boolean(), nullable=False),
        sa.Column("teardown_pending", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tasks")),
    )
    op.create_index("ix_tasks_account_created", "tasks", ["account_id", "created_at", "id"])
    op.create_index("ix_tasks_status", "tasks", ["status"])
    op.create_index("ix_tasks_teardown", "tasks", ["teardown_pending"])
    for table in ("task_events", "task_results"):
        columns = [
            sa.Column("id", sa.String(36), nullable=False),
            sa.Column("task_id", sa.String(36), nullable=False),
            sa.Column("account_id", sa.String(128), nullable=False),
            sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        ]
        if table == "task_events":
            columns.append(sa.Column("message", sa.Text(), nullable=False))
        else:
            columns += [
                sa.Column("name", sa.String(190), nullable=False),
                sa.Column("metadata", sa.JSON(), nullable=False),
                sa.Column("percent_complete", sa.Integer(), nullable=False),
                sa.Column("reference", sa.Text()),
                sa.Column("digest", sa.String(128)),
            ]
        constraints = [
            sa.PrimaryKeyConstraint("id", name=op.f(f"pk_{table}")),
            sa.ForeignKeyConstraint(
                ["task_id"],
                ["tasks.id"],
                name=op.f(f"fk_{table}_task_id_tasks"),
                ondelete="CASCADE",
            ),
        ]
        op.create_table(table, *columns, *constraints)
        op.create_index(f"ix_{table}_task_created", table, ["task_id", "created_at", "id"])


def downgrade() -> None:
    op.drop_table("task_results")
    op.drop_table("task_events")
    op.drop_table("tasks")
