"""A task's container lines, read as an instance's are (deployments/logs): live from its
cluster's adapter while its objects are there (launched, running, or stopping within its grace
period), its secret values masked; once they are gone, the last lines kept as they left
(`logs_kept_lines` per container, as a failed instance's)."""

from __future__ import annotations

import uuid

from sqlalchemy.ext.asyncio import AsyncSession

from service.backends.logs import LogRequest
from service.clusters.adapters import AdapterRegistry
from service.core.errors import BadGateway
from service.deployments.logs.mask import Masker
from service.deployments.logs.service import Reading, Source, kept_reading
from service.tasks.models import TaskStatus
from service.tasks.observed import instance_of
from service.tasks.service import Tasks

_LIVE = frozenset({TaskStatus.LAUNCHED, TaskStatus.RUNNING})


async def task_reading(
    session: AsyncSession,
    tasks: Tasks,
    registry: AdapterRegistry,
    account_id: str,
    task_id: uuid.UUID,
    request: LogRequest,
) -> Reading:
    """The task's log (404 for another account's task or one that does not exist)."""
    task = await tasks.owned(session, account_id, task_id)
    cluster = task.cluster
    if cluster is None or not (TaskStatus(task.status) in _LIVE or task.teardown_pending):
        return kept_reading(request, task.kept_logs or [])
    adapter = registry.get(cluster)
    if adapter is None:
        reason = registry.unavailable_reason(cluster) or cluster
        raise BadGateway(detail=f"cannot read the logs of task {task_id}: {reason}")
    masker = Masker(tasks.secrets_of(task).values())
    return Reading(
        request, masker, [Source(adapter, instance_of(task))], label=request.container is None
    )
