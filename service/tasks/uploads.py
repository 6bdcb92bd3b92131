"""UPLOAD pushes of task results, run off the task loop's pass so one slow push stalls nothing."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.backends.protocol import AdapterError, InstanceSpec, TaskFiles
from service.clusters.adapters import AdapterRegistry
from service.tasks import repository, transitions
from service.tasks.models import Task, TaskStatus
from service.tasks.results import (
    PushPolicy,
    ResultPushFailed,
    parse_results_location,
    push_credentials,
    upload_result,
)
from service.tasks.service import Tasks

log = logging.getLogger("nvcf.tasks")


class ResultUploads:
    """The pushes in flight, by task; `wake(task_id)` is called as each one ends."""

    def __init__(
        self,
        maker: async_sessionmaker[AsyncSession],
        adapters: AdapterRegistry,
        tasks: Tasks,
        clock: Callable[[], datetime],
        wake: Callable[[str], None],
    ) -> None:
        self.maker = maker
        self.adapters = adapters
        self.tasks = tasks
        self.clock = clock
        self.wake = wake
        self._running: dict[uuid.UUID, set[asyncio.Task[None]]] = {}

    def pending(self, task_id: uuid.UUID) -> bool:
        """Whether a push of one of the task's results is in flight."""
        return bool(self._running.get(task_id))

    async def cancel(self) -> None:
        """Cancel every push in flight, and wait for them to end."""
        pending = [u for ups in self._running.values() for u in ups]
        for upload in pending:
            upload.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    def push(self, task: Task, instance: InstanceSpec, result_id: uuid.UUID, name: str) -> None:
        running = self._running.setdefault(task.id, set())
        upload = asyncio.create_task(
            self._upload(task, instance, result_id, name), name=f"nvcf-task-result-{task.id}"
        )
        running.add(upload)

        def done(finished: asyncio.Task[None]) -> None:
            running.discard(finished)
            if not running:
                self._running.pop(task.id, None)
            self.wake(str(task.id))

        upload.add_done_callback(done)

    async def _upload(
        self, task: Task, instance: InstanceSpec, result_id: uuid.UUID, name: str
    ) -> None:
        """Push result `name` of `task`; ERRORED with the registry's reason when it fails."""
        settings = self.tasks.settings
        adapter = self.adapters.get(task.cluster or "")
        target, problems = parse_results_location(task.results_location, settings)
        try:
            if target is None:
                raise ResultPushFailed(
                    str(task.results_location), 0, "; ".join(p.message for p in problems)
                )
            if not isinstance(adapter, TaskFiles):
                raise ResultPushFailed(
                    target.reference(name), 0, f"cluster {task.cluster} cannot copy results"
                )
            async with self.maker() as session:
                logins = await push_credentials(
                    session,
                    task.account_id,
                    target,
                    task_secrets=self.tasks.secrets_of(task),
                    box=self.tasks.box,
                )
            pushed = await upload_result(
                adapter,
                instance,
                name,
                target,
                logins,
                workdir=settings.data_dir / "task-results",
                policy=PushPolicy.of(settings),
            )
        except (ResultPushFailed, AdapterError) as exc:
            reason = exc.reason if isinstance(exc, ResultPushFailed) else exc.message
            log.warning("task %s: result %s: %s", task.id, name, reason)
            async with self.maker() as session, session.begin():
                row = await repository.get_for_update(session, task.id)
                if row is not None and TaskStatus(row.status) in (
                    TaskStatus.LAUNCHED,
                    TaskStatus.RUNNING,
                ):
                    why = f"result {name} could not be pushed: {reason}"
                    transitions.move(
                        session,
                        row,
                        TaskStatus.ERRORED,
                        self.clock(),
                        f"Task errored: {why}",
                        error=why,
                    )
            return
        async with self.maker() as session, session.begin():
            stored = await repository.result(session, result_id)
            if stored is not None:
                stored.reference = pushed.reference
                stored.digest = pushed.digest
            row = await repository.get_for_update(session, task.id)
            if row is not None:
                transitions.event(
                    session, row, f"Result {name} pushed to {pushed.reference}", self.clock()
                )
