"""The task loop: places queued tasks on the clusters (sharing their capacity with functions
through `adapter.capacity()`), launches them, observes them, applies the progress rules and the
clocks (clocks.py), delivers rotated secrets, stops canceled tasks (asked to stop, killed after
the grace period) and removes what ended from the cluster.

It holds no state of its own between passes: every decision reads the task's row and the
cluster, so a restarted server carries on each task's clocks where they were.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.backends.protocol import (
    AdapterError,
    BackendAdapter,
    Capacity,
    InstanceSpec,
    TaskFiles,
)
from service.charts.mutate import secrets_object
from service.clusters.adapters import AdapterRegistry
from service.clusters.catalog import Catalog
from service.clusters.instance_types import parse_instance_type
from service.core.db import utcnow
from service.core.kube import is_nvlink
from service.core.loops import LoopService
from service.deployments.logs.keep import last_lines
from service.deployments.logs.mask import Masker
from service.observability.collector import sidecar_for, workload_attributes
from service.registry.pull_secrets import PullSecrets, account_pull_secrets
from service.tasks import repository, transitions
from service.tasks.clocks import (
    MAX_PROGRESS_BYTES,
    STARTED,
    Decision,
    container_of,
    decide,
    progress_refused,
)
from service.tasks.models import Task, TaskResult, TaskStatus
from service.tasks.observed import (
    Removed,
    Seen,
    clock_of,
    each,
    instance_of,
    progressed,
    task_id_of,
)
from service.tasks.queue import no_room
from service.tasks.service import Tasks
from service.tasks.uploads import ResultUploads
from service.tasks.workload import CONTAINER_NAME, helm_objects, is_job, job_objects

log = logging.getLogger("nvcf.tasks")
#: results (distinct names) one task may report
MAX_RESULTS = 1000
#: queued tasks placement reads at a time, in their turn (queue.py's order, read in SQL), with
#: their whole rows: a pass reads the queue only as far as it places or holds back tasks
PLACE_CHUNK = 16


class TaskLoop(LoopService[str]):
    """Runs `run_pass()` over every task every `period` seconds, and at once over the tasks
    named when woken with their ids (a task created, canceled or deleted, a push of its
    result ended, or its cluster reported a change of it: `changed`)."""

    def __init__(
        self,
        maker: async_sessionmaker[AsyncSession],
        adapters: AdapterRegistry,
        catalog: Catalog,
        tasks: Tasks,
        *,
        period: float = 1.0,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.maker = maker
        self.adapters = adapters
        self.catalog = catalog
        self.tasks = tasks
        self.clock = clock
        #: the queue and capacity of the last pass that could start nothing
        self._blocked: tuple[object, ...] | None = None
        self._apply_failed = False
        #: UPLOAD pushes in flight, by task: off the pass, so one slow push stalls no placement
        self._uploads = ResultUploads(maker, adapters, tasks, lambda: self.clock(), self.wake)
        #: the ids of the tasks on a cluster as of the last pass (and those launched since)
        self._watched: set[str] = set()
        #: called when a pass sees a task naming telemetries on a cluster (the task exports,
        #: which read nothing while no task names one, follow its lines)
        self.on_telemetry: Callable[[], None] = lambda: None
        super().__init__(
            "nvcf-tasks",
            self.run_pass,
            period,
            log=log,
            failure="task loop pass failed",
            urgent=self.run_pass,
        )

    async def stop(self) -> None:
        await super().stop()
        await self._uploads.cancel()

    def changed(self, instance_ids: set[str], resync: bool) -> set[str]:
        """What the clusters' change feeds reported: a pass now when one of the tasks on a
        cluster changed (its container exited, say), rather than at the next period: over those
        tasks alone unless a feed may have missed changes. The ids that are tasks on a cluster
        (no instance of a function has them)."""
        ours = instance_ids & self._watched
        if resync:
            self.wake()
        elif ours:
            self.wake(*ours)
        return ours

    async def run_pass(self, only: set[str] | None = None) -> None:
        """One pass over every task on a cluster, or over those of them named in `only` (task
        ids); placement and removing deleted tasks either way."""
        now = self.clock()
        ids = None if only is None else {i for i in map(task_id_of, only) if i is not None}
        # what the pass starts from, in one read: the queue's signature, the tasks on a
        # cluster to look at, and the deleted tasks whose objects are gone
        async with self.maker() as session:
            signature = await repository.queue_signature(session)
            tasks = list(await repository.on_cluster(session, ids))
            gone = await repository.deleted_and_clean(session)
        if any(t.telemetries for t in tasks):
            self.on_telemetry()
        # the queue is offered capacity first: a cluster frees a container's GPUs when it
        # exits (Kubernetes counts no Succeeded or Failed pod), so the next launch waits
        # neither for the exit to be observed and written nor for the objects' removal; what
        # the pass launched is looked at from the next pass on
        launched = await self._place(now, signature)
        await self._watch(now, only, tasks, launched)
        if gone:
            async with self.maker() as session, session.begin():
                await repository.remove(session, gone)

    # ------------------------------------------------------------------ placement

    async def _place(
        self, now: datetime, queue: tuple[int, datetime | None, datetime | None]
    ) -> set[uuid.UUID]:
        """Launch what the clusters have room for, in the queue's order (`queue`: its
        signature, `repository.queue_signature`); the tasks launched."""
        count, newest, first_deadline = queue
        if not count:
            self._blocked = None
            return set()
        capacities: dict[str, Capacity] = {}
        for name, adapter in self.adapters.items():
            try:
                capacities[name.lower()] = await adapter.capacity()
            except AdapterError as exc:
                log.warning("task placement: capacity of %s: %s", name, exc.message)
        signature = (count, newest, tuple(sorted(capacities.items())))
        due = first_deadline is not None and now >= first_deadline
        if signature == self._blocked and not due:
            return set()  # the same queue against the same capacity: nothing can start
        self._blocked = None
        clusters = len(capacities)
        pulls: dict[str, PullSecrets] = {}  # by account: read once a pass
        async with self.maker() as session:
            expired = await repository.queued_expired(session, now, PLACE_CHUNK)
            page = await repository.queued_in_turn(session, now, PLACE_CHUNK)
            # the head of the queue with the queue, and its accounts' pull secrets
            rows = await self._chunk(session, [task_id for task_id, _, _ in page], pulls)
        for task_id in expired:
            await self._move(
                task_id,
                TaskStatus.EXCEEDED_MAX_QUEUED_DURATION,
                now,
                "Task waited longer than its maxQueuedDuration for GPUs",
                "no capacity within maxQueuedDuration",
            )
        self._apply_failed = False
        started = False
        launched: list[tuple[uuid.UUID, str, datetime]] = []
        #: accounts whose next task could not be placed: none of their later ones go first
        held: set[str] = set()
        try:
            while page:
                for task_id, account_id, _ in page:
                    row = rows.get(task_id)
                    if account_id in held or row is None or row.status != TaskStatus.QUEUED.value:
                        continue  # held back, or canceled or deleted since the queue was read
                    placed = await self._try_place(row, capacities, now, launched, pulls)
                    started = started or placed
                    if not placed:
                        held.add(account_id)
                if len(page) < PLACE_CHUNK or no_room(capacities, clusters):
                    break  # the queue's end, or no room left for any task
                async with self.maker() as session:
                    page = await repository.queued_in_turn(
                        session, now, PLACE_CHUNK, held=held, after=page[-1][2]
                    )
                    rows = await self._chunk(session, [task_id for task_id, _, _ in page], pulls)
        finally:
            # what was applied is recorded even when a later placement failed
            await self._launched(launched)
        if not started and not self._apply_failed and not expired:
            self._blocked = signature
        return {task_id for task_id, _, _ in launched}

    async def _chunk(
        self, session: AsyncSession, order: list[uuid.UUID], pulls: dict[str, PullSecrets]
    ) -> dict[uuid.UUID, Task]:
        """The rows of the first `PLACE_CHUNK` tasks of `order`; the pull secrets of their
        accounts are added to `pulls`."""
        rows = await repository.many(session, order[:PLACE_CHUNK])
        for account_id in {t.account_id for t in rows.values()} - set(pulls):
            pulls[account_id] = await account_pull_secrets(session, account_id, self.tasks.box)
        return rows

    async def _try_place(
        self,
        task: Task,
        capacities: dict[str, Capacity],
        now: datetime,
        launched: list[tuple[uuid.UUID, str, datetime]],
        pulls: dict[str, PullSecrets],
    ) -> bool:
        """Apply the task on the first candidate cluster with room; (id, cluster, when) of an
        applied one is added to `launched`, recorded with the pass's other launches."""
        instance = instance_of(task)
        for name in task.candidate_clusters:
            adapter = self.adapters.get(name)
            if adapter is None:
                continue
            key = name.lower()
            if key not in capacities:
                try:
                    capacities[key] = await adapter.capacity()
                except AdapterError as exc:
                    log.warning("task placement: capacity of %s: %s", name, exc.message)
                    continue
            if not capacities[key].fits(instance.gpu, instance.gpus_per_node, instance.nodes):
                continue
            task.cluster = name
            placed = instance_of(task)
            try:
                objects = await self._objects(task, name, pulls=pulls)
                await adapter.apply(await self._telemetry(task, placed), objects)
            except AdapterError as exc:
                if exc.retryable:
                    log.warning("task %s: apply on %s failed: %s", task.id, name, exc.message)
                    self._apply_failed = True
                    task.cluster = None
                    return False
                await self._move(
                    task.id,
                    TaskStatus.ERRORED,
                    now,
                    f"Task errored: cluster {name} refused it: {exc.message}",
                    exc.message,
                )
                return True
            capacities.pop(key, None)  # read again: the task took some of it
            # LAUNCHED at its apply, not at the pass's start: its container starts from here
            launched.append((task.id, name, self.clock()))
            return True
        return False

    async def _objects(
        self,
        task: Task,
        cluster_name: str,
        *,
        suspend: bool = False,
        pulls: dict[str, PullSecrets] | None = None,
    ) -> list[dict[str, Any]]:
        """The task's objects; `pulls`: the accounts' pull secrets already read this pass."""
        cluster = self.catalog.cluster(cluster_name)
        assert cluster is not None
        pulls = {} if pulls is None else pulls
        pull = pulls.get(task.account_id)
        if pull is None:
            async with self.maker() as session:
                pull = await account_pull_secrets(session, task.account_id, self.tasks.box)
            pulls[task.account_id] = pull
        backend = self.catalog.group_of(cluster).name
        if task.objects is not None:
            return helm_objects(
                task.objects,
                task_id=str(task.id),
                name=task.name,
                nca_id=task.account_id,
                instance_type=task.instance_type,
                backend=backend,
                region=cluster.region,
                secrets=self.tasks.secrets_of(task),
                grace_seconds=task.grace_seconds,
                pull_secrets=pull,
                suspend=suspend,
                nvlink=is_nvlink(cluster.attributes),
            )
        assert task.container_image is not None
        return job_objects(
            task_id=str(task.id),
            name=task.name,
            nca_id=task.account_id,
            image=task.container_image,
            args=task.container_args,
            environment=task.container_environment,
            cluster=cluster,
            backend=backend,
            instance_type=parse_instance_type(task.instance_type),
            max_runtime_seconds=task.max_runtime_seconds,
            grace_seconds=task.grace_seconds,
            secrets=self.tasks.secrets_of(task),
            pull_secrets=pull,
            suspend=suspend,
        )

    async def _launched(self, launched: list[tuple[uuid.UUID, str, datetime]]) -> None:
        """Record the pass's launches, (task id, cluster, when), in one transaction."""
        if not launched:
            return
        async with self.maker() as session, session.begin():
            rows = await repository.many_for_update(session, [i for i, _, _ in launched])
            for task_id, cluster, at in launched:
                self._watched.add(str(task_id))
                task = rows.get(task_id)
                if task is None:
                    continue
                task.cluster = cluster
                if task.status != TaskStatus.QUEUED.value:
                    # canceled while being applied: its objects come off the cluster
                    task.teardown_pending = True
                    continue
                task.secrets_delivered = task.secrets_generation
                transitions.move(
                    session, task, TaskStatus.LAUNCHED, at, f"Task launched on cluster {cluster}"
                )

    # ------------------------------------------------------------------ watching

    async def _watch(
        self, now: datetime, only: set[str] | None, tasks: list[Task], launched: set[uuid.UUID]
    ) -> None:
        """Observe `tasks`, those on a cluster as the pass began (of `only`, when given: what
        the pass `launched` is looked at from the next pass on), and act on what they show."""
        found = {str(t.id) for t in tasks} | {str(i) for i in launched}
        self._watched = found if only is None else (self._watched - only) | found
        # every task is looked at first (together: each look waits on its cluster), then what
        # they showed is written in one transaction, then what ended comes off the clusters
        # (its events again in one transaction)
        looked = await each(tasks, lambda task: self._look(task, now))
        seen = [one for one in looked if isinstance(one, Seen)]
        teardowns = [one for one in looked if isinstance(one, Task)]
        teardowns += await self._record(seen, now)
        await self._teardown(teardowns, now)

    async def _look(self, task: Task, now: datetime) -> Seen | Task | None:
        """What a pass does with one task on a cluster: what it showed to be written (Seen),
        the task itself when its objects are to come off the cluster, or None."""
        adapter = self.adapters.get(task.cluster or "")
        if adapter is None:
            if task.cluster and self.catalog.cluster(task.cluster) is None:
                await self._cluster_gone(task.id, task.cluster, now)
            return None  # in the catalog but its adapter unavailable: it may come back
        try:
            if task.teardown_pending and TaskStatus(task.status) not in (
                TaskStatus.LAUNCHED,
                TaskStatus.RUNNING,
            ):
                return task
            return await self._observe(task, adapter, now)
        except AdapterError as exc:
            log.warning("task %s on %s: %s", task.id, task.cluster, exc.message)
            return None

    async def _observe(self, task: Task, adapter: BackendAdapter, now: datetime) -> Seen | None:
        """Apply the rules to what the task shows; what is to be written (None: nothing)."""
        instance = instance_of(task)
        container = container_of(await adapter.observe(instance), CONTAINER_NAME)
        raw: bytes | None = None
        refused: str | None = None
        if isinstance(adapter, TaskFiles) and container.started:
            try:
                raw = await adapter.task_progress(instance, max_bytes=MAX_PROGRESS_BYTES)
            except AdapterError as exc:
                if exc.retryable:
                    raise
                refused = exc.message
        if refused is not None:
            decision = progress_refused(refused)
        else:
            decision = decide(clock_of(task), container, raw, now)
        if decision.status is TaskStatus.COMPLETED and await self._settle(
            task, adapter, decision, now
        ):
            # COMPLETED once every result is pushed (a failed push makes it ERRORED instead)
            decision = Decision(progress=decision.progress)
        rotate = task.secrets_delivered < task.secrets_generation and decision.status is None
        if rotate:
            await adapter.update_objects(instance, [secrets_object(self.tasks.secrets_of(task))])
        if rotate or decision.status is not None or progressed(task, decision):
            return Seen(task.id, decision, task.secrets_generation, container.started)
        return None

    async def _record(self, seen: list[Seen], now: datetime) -> list[Task]:
        """Write what the tasks showed, in one transaction; the tasks that ended with objects
        to remove. New results of UPLOAD tasks are pushed once written."""
        if not seen:
            return []
        pushes: list[tuple[Task, uuid.UUID, str]] = []
        ended: list[Task] = []
        async with self.maker() as session, session.begin():
            rows = await repository.many_for_update(session, [s.task_id for s in seen])
            for one in seen:
                task = rows.get(one.task_id)
                if task is None or TaskStatus(task.status) not in (
                    TaskStatus.LAUNCHED,
                    TaskStatus.RUNNING,
                ):
                    continue  # canceled meanwhile: the next pass stops it
                reported = await self._record_one(session, task, one, now)
                if reported is not None:
                    pushes.append((task, reported.id, reported.name))
                if task.teardown_pending and TaskStatus(task.status) not in (
                    TaskStatus.LAUNCHED,
                    TaskStatus.RUNNING,
                ):
                    ended.append(task)
        for task, result_id, name in pushes:
            self._uploads.push(task, instance_of(task), result_id, name)
        return ended

    async def _record_one(
        self, session: AsyncSession, task: Task, seen: Seen, now: datetime
    ) -> TaskResult | None:
        """Write what one task showed; a new result its UPLOAD handling pushes."""
        decision, generation, started = seen.decision, seen.generation, seen.started
        reported: TaskResult | None = None
        if decision.status is None and task.secrets_delivered < generation:
            task.secrets_delivered = generation
        progress = decision.progress
        if progress is not None:
            task.percent_complete = progress.percent
            task.last_heartbeat_at = progress.last_updated_at
            task.progress_metadata = progress.metadata
            if progress.name is not None and progress.name != task.result_name:
                task.result_name = progress.name
                names = await repository.result_names(session, task.id)
                if progress.name not in names and len(names) >= MAX_RESULTS:
                    decision = Decision(
                        TaskStatus.ERRORED,
                        f"Task errored: it reported more than {MAX_RESULTS} results",
                        f"more than {MAX_RESULTS} results",
                    )
                elif progress.name not in names:
                    reported = TaskResult(
                        id=transitions.ordered_id(),
                        task_id=task.id,
                        account_id=task.account_id,
                        name=progress.name,
                        metadata_=progress.metadata,
                        percent_complete=progress.percent,
                        created_at=now,
                    )
                    session.add(reported)
                    transitions.event(
                        session,
                        task,
                        f"Result {progress.name} reported at {progress.percent}%",
                        now,
                    )
            transitions.touch(task, now)
        if decision.status is not None:
            if (
                started
                and task.status == TaskStatus.LAUNCHED.value
                and decision.status is not TaskStatus.RUNNING
            ):
                # it started and ended between two passes: its timeline still shows it ran
                transitions.move(session, task, TaskStatus.RUNNING, now, STARTED)
            transitions.move(
                session, task, decision.status, now, decision.message, error=decision.error
            )
        upload = task.result_handling == "UPLOAD" and decision.status in (
            None,
            TaskStatus.RUNNING,
        )
        return reported if upload else None

    # ------------------------------------------------------------------ results (UPLOAD)

    async def _settle(
        self, task: Task, adapter: BackendAdapter, decision: Decision, now: datetime
    ) -> bool:
        """Whether a completing task must wait for its results: first every checkpoint under
        NVCT_RESULTS_DIR is recorded (one the container reported for less than a pass left
        only its directory), then, with UPLOAD, every unpushed one is pushed (also those a
        restart left: no reference, no push in flight)."""
        progress = decision.progress
        if progress is not None and progress.name not in (None, task.result_name):
            return True  # reported with its 100%: recorded (and its push started) first
        if self._uploads.pending(task.id):
            return True
        if isinstance(adapter, TaskFiles):
            found = await adapter.task_result_names(instance_of(task), max_names=MAX_RESULTS)
            if found:
                await self._found(task.id, found, now)
        if task.result_handling != "UPLOAD":
            return False
        async with self.maker() as session:
            for row in await repository.unpushed_results(session, task.id):
                self._uploads.push(task, instance_of(task), row.id, row.name)
        return self._uploads.pending(task.id)

    async def _found(self, task_id: uuid.UUID, found: list[str], now: datetime) -> None:
        """Record the results found on the task's files that its progress file never named
        (their percent: the task's when found)."""
        async with self.maker() as session, session.begin():
            task = await repository.get_for_update(session, task_id)
            if task is None or not found:
                return
            names = await repository.result_names(session, task.id)
            for name in found:
                if name in names or len(names) >= MAX_RESULTS:
                    continue
                names.add(name)
                session.add(
                    TaskResult(
                        id=transitions.ordered_id(),
                        task_id=task.id,
                        account_id=task.account_id,
                        name=name,
                        metadata_={},
                        percent_complete=task.percent_complete or 0,
                        created_at=now,
                    )
                )
                transitions.event(
                    session, task, f"Result {name} found in NVCT_RESULTS_DIR at completion", now
                )

    async def _teardown(self, tasks: list[Task], now: datetime) -> None:
        """Take the ended tasks' objects off their clusters; their events in one transaction."""

        async def one(task: Task) -> tuple[uuid.UUID, Removed | None]:
            adapter = self.adapters.get(task.cluster or "")
            if adapter is None:
                return task.id, None
            try:
                return task.id, await self._take_down(task, adapter, now)
            except AdapterError as exc:
                log.warning("task %s on %s: %s", task.id, task.cluster, exc.message)
                return task.id, None

        removed = {i: r for i, r in await each(tasks, one) if r is not None}
        if not removed:
            return
        async with self.maker() as session, session.begin():
            rows = await repository.many_for_update(session, list(removed))
            for task_id, gone in removed.items():
                row = rows.get(task_id)
                if row is not None and row.teardown_pending:
                    row.teardown_pending = False
                    row.kept_logs = gone.kept
                    transitions.event(session, row, gone.message, now)

    async def _take_down(
        self, task: Task, adapter: BackendAdapter, now: datetime
    ) -> Removed | None:
        """Ask the task's container to stop, or remove its objects: once they are removed,
        the event saying so and the containers' last lines, read just before (None: not
        yet)."""
        instance = instance_of(task)
        kill = task.kill_at
        if task.objects is not None and not any(is_job(o) for o in task.objects):
            # a helm task without a Job: deleting its pods asks them to stop, and Kubernetes
            # kills them after their grace period (the task's, helm_objects)
            message = "Task objects removed from the cluster"
        elif task.stop_requested_at is not None and kill is not None and now < kill:
            container = container_of(await adapter.observe(instance), CONTAINER_NAME)
            if container.started and container.exit_code is None:
                # asked to stop (idempotent): Kubernetes deletes a suspended Job's pod within
                # its grace period; the kill below comes at the task's own deadline
                if task.cluster:
                    await adapter.apply(
                        await self._telemetry(task, instance),
                        await self._objects(task, task.cluster, suspend=True),
                    )
                return None
            message = "Task container stopped"
        elif task.stop_requested_at is not None:
            message = "Task container killed after its termination grace period"
        else:
            message = "Task objects removed from the cluster"
        settings = self.tasks.settings
        kept = (
            []
            if task.deleted
            else await last_lines(
                adapter,
                instance,
                Masker(self.tasks.secrets_of(task).values()),
                lines=settings.logs_kept_lines,
                max_bytes=settings.logs_kept_bytes,
            )
        )
        return Removed(message, kept) if await adapter.delete(instance) else None

    async def _telemetry(self, task: Task, instance: InstanceSpec) -> InstanceSpec:
        """`instance` with the collector of the telemetries the task names (if any)."""
        if not task.telemetries:
            return instance
        attributes = workload_attributes(task.account_id, instance.instance_id, task_name=task.name)
        async with self.maker() as session:
            sidecar = await sidecar_for(
                session, self.tasks.box, task.account_id, task.telemetries, attributes
            )
        return dataclasses.replace(instance, telemetry=sidecar)

    async def _cluster_gone(self, task_id: uuid.UUID, cluster: str, now: datetime) -> None:
        """The task's cluster left the catalog: nothing can observe or stop it any more, so
        it errors (as a function's instance fails there) and its objects count as removed."""
        why = f"its cluster {cluster} was removed from the cluster catalog"
        async with self.maker() as session, session.begin():
            task = await repository.get_for_update(session, task_id)
            if task is None:
                return
            if TaskStatus(task.status) in (TaskStatus.LAUNCHED, TaskStatus.RUNNING):
                transitions.move(
                    session, task, TaskStatus.ERRORED, now, f"Task errored: {why}", error=why
                )
            if task.teardown_pending:
                task.teardown_pending = False
                transitions.event(session, task, f"Task objects left behind: {why}", now)

    async def _move(
        self, task_id: uuid.UUID, to: TaskStatus, now: datetime, message: str, error: str
    ) -> None:
        """End a queued task (canceled meanwhile: left as it is)."""
        async with self.maker() as session, session.begin():
            task = await repository.get_for_update(session, task_id)
            if task is not None and task.status == TaskStatus.QUEUED.value:
                transitions.move(session, task, to, now, message, error=error)
