"""A task's GPU time for metering (metering/usage.py): a task still on a cluster is an open
span read from its row; once it ends, its interval is stored (transitions.py)."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from service.metering.intervals import gpus_of
from service.metering.usage import Span
from service.tasks import repository


async def open_spans(session: AsyncSession, account_id: str | None) -> list[Span]:
    """The account's tasks (every account's: None) launched or running, each a span not yet
    ended."""
    return [
        Span(
            account_id=task.account_id,
            function_id=None,
            version_id=None,
            task_id=str(task.id),
            instance_type=task.instance_type,
            cluster=task.cluster,
            gpus=gpus_of(task.instance_type),
            created_at=task.launched_at or task.updated_at,
            started_at=task.running_at,
            ended_at=None,
        )
        for task in await repository.launched_or_running(session, account_id)
    ]
