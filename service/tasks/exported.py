"""The tasks' side of the in-process export (observability/export.py), as deployments/exported.py
is the instances': each task naming telemetries, labelled with its id, name and account.

A pass every `period` seconds reads the tasks naming telemetries that are queued, launched,
running, or ended within `RETAIN` seconds (one statement, a few columns):

- their snapshot goes to the export, whose METRICS pipelines read it in the task gauges
  (progress, status, GPUs; an ended task is shown in its last status for `RETAIN` seconds);
- a task naming a LOGS telemetry whose objects are on its cluster gets a follower (unless the
  cluster adds the collector to its Job, which sends them) (at most
  `limit` at once): every line the task logs route shows, masked and cut the same way, from
  the container's start; a follow that ends while the task is still there follows again from
  the last line's time. A follower is left to end with its objects (the follow ends when they
  are removed), so the last lines are sent; it is cancelled `RETAIN` seconds after its task
  left them at the latest;
- one replica follows a task's lines (a lease on the task's row, renewed each pass): the
  last line sent is written each pass and when the replica stops (giving the lease up), and
  the replica that takes the lease over follows from after it;
- a task naming a TRACES telemetry that ended is handed over once (observability/tasks.py
  makes its trace, with ids derived from the task's id).

A pass that found no task naming telemetries makes the next ones read nothing until a task is
created, canceled or deleted or the clusters report a change (`changed()`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.backends.kubernetes.adapter import adds_collector
from service.backends.logs import LogRequest, cut
from service.backends.protocol import AdapterError
from service.clusters.adapters import AdapterRegistry
from service.clusters.instance_types import parse_instance_type
from service.core.db import utcnow
from service.core.loops import FollowingLoop
from service.deployments.logs.mask import Masker
from service.observability.events import TaskEnded, TaskLogged, TaskSeen
from service.observability.export import Exports
from service.observability.logs import time_of
from service.observability.models import Kind
from service.observability.references import FIELDS
from service.observability.tasks import TaskLine
from service.tasks import repository
from service.tasks.models import ON_CLUSTER, TaskStatus
from service.tasks.observed import instance_of
from service.tasks.service import Tasks

log = logging.getLogger("nvcf.observability")

#: seconds an ended task stays in the gauges (its last status), and how far back a pass looks
#: for ended tasks whose trace is not sent yet
RETAIN = 120.0
#: passes a replica's lease on following a task's lines lasts unrenewed (at least
#: LEASE_SECONDS): then another replica takes the task's lines over
LEASE_PASSES = 3
LEASE_SECONDS = 15.0


def _names(telemetries: Mapping[str, object] | None, kind: Kind) -> bool:
    return any(FIELDS.get(k) is kind and v for k, v in (telemetries or {}).items())


def _ns(when: datetime | None) -> int | None:
    return None if when is None else int(when.timestamp() * 1e9)


@dataclass(frozen=True)
class Exported:
    """A task naming telemetries as a pass reads it."""

    seen: TaskSeen
    cluster: str | None
    on_cluster: bool
    created_at: datetime
    launched_at: datetime | None
    running_at: datetime | None
    finished_at: datetime | None

    @property
    def task_id(self) -> uuid.UUID:
        return uuid.UUID(self.seen.task_id)

    def ended(self) -> TaskEnded | None:
        if self.finished_at is None:
            return None
        return TaskEnded(
            self.seen,
            int(self.created_at.timestamp() * 1e9),
            _ns(self.launched_at),
            _ns(self.running_at),
            int(self.finished_at.timestamp() * 1e9),
        )


async def exported(session: AsyncSession, since: datetime) -> list[Exported]:
    """The tasks naming telemetries that are active, on a cluster or ended after `since`."""
    out: list[Exported] = []
    for row in await repository.telemetry_rows(session, since):
        telemetries = {str(k): str(v) for k, v in (row.telemetries or {}).items() if v}
        if not any(k in FIELDS for k in telemetries):
            continue
        it = parse_instance_type(row.instance_type)
        status = TaskStatus(row.status)
        seen = TaskSeen(
            row.account_id,
            str(row.id),
            row.name,
            telemetries,
            status.value,
            row.percent_complete,
            it.gpus_per_node * it.nodes,
        )
        on_cluster = row.cluster is not None and (status in ON_CLUSTER or row.teardown_pending)
        out.append(
            Exported(
                seen,
                row.cluster,
                on_cluster,
                row.created_at,
                row.launched_at,
                row.running_at,
                row.finished_at if status not in ON_CLUSTER else None,
            )
        )
    return out


class TaskExports(FollowingLoop[uuid.UUID]):
    """The replica's task snapshot, log followers and ended tasks' traces (a loop
    service)."""

    def __init__(
        self,
        maker: async_sessionmaker[AsyncSession],
        adapters: AdapterRegistry,
        tasks: Tasks,
        exports: Exports,
        owner: str,
        *,
        period: float,
        limit: int,
    ) -> None:
        self._maker, self._adapters, self._tasks = maker, adapters, tasks
        self._exports, self._owner = exports, owner
        #: the time stamp of the last line sent of each task this replica follows
        self._sent: dict[uuid.UUID, str] = {}
        super().__init__(
            "telemetry-tasks",
            self.pass_once,
            period,
            log=log,
            failure="telemetry export of tasks: a pass failed",
        )
        self.period, self.limit = period, limit
        #: followers of tasks no longer on their cluster, and when they must end at the latest
        self._leaving: dict[uuid.UUID, float] = {}
        #: the ended tasks seen ended (their trace handed over; forgotten after 2 RETAIN)
        self._ended: dict[uuid.UUID, float] = {}
        self._wanted: set[uuid.UUID] = set()
        #: the last pass found no task naming telemetries: passes read nothing until
        #: `changed()` (a server with no telemetry in use does no periodic reads for it)
        self._idle = False
        self._changed = False

    def changed(self, *_: object) -> None:
        """A task was created, canceled or deleted, or the clusters reported a change: the next
        pass reads."""
        self._changed = True  # read at the next pass: at most one a period, however many

    async def pass_once(self) -> None:
        if self._idle and not self._changed:
            return
        self._changed = False
        async with self._maker() as session:
            rows = await exported(session, utcnow() - timedelta(seconds=RETAIN))
        self._idle = not rows and not self.following
        self._exports.tasks([r.seen for r in rows])
        now = time.monotonic()
        self._ended = {k: at for k, at in self._ended.items() if now - at < 2 * RETAIN}
        logged = {r.task_id for r in rows if self._logs(r)}
        mine = await self._lease(logged) if logged or self._sent else {}
        for task_id, sent in mine.items():
            self._sent.setdefault(task_id, sent)
        self._wanted = {r.task_id for r in rows if r.on_cluster and r.task_id in mine}
        for row in rows:
            ended = row.ended()
            if ended is None or row.task_id in self._ended:
                continue
            self._ended[row.task_id] = now
            if _names(row.seen.telemetries, Kind.TRACES):
                self._exports.invocation(ended)
            if row.task_id in mine and not row.on_cluster and row.task_id not in self.following:
                # ended between two passes: its lines are those kept as it left
                self._start(row)
        for task_id in [t for t in self.following if t in logged and t not in mine]:
            self.following.pop(task_id).cancel()  # another replica follows it now
            self._sent.pop(task_id, None)
        for task_id in list(self.following):
            if task_id in self._wanted:
                self._leaving.pop(task_id, None)
                continue
            due = self._leaving.setdefault(task_id, now + RETAIN)
            follower = self.following[task_id]
            if follower.done() or now >= due:
                follower.cancel()
                del self.following[task_id]
                self._leaving.pop(task_id, None)
        for row in rows:
            if row.task_id not in self._wanted:
                continue
            running = self.following.get(row.task_id)
            if running is None or running.done():
                self._start(row)

    async def _lease(self, logged: set[uuid.UUID]) -> dict[uuid.UUID, str]:
        """Of the tasks whose lines go to a telemetry, those this replica follows (one
        replica follows a task: a lease renewed each pass, taken over once its holder stopped
        renewing it), with the last line sent of each; the last line sent of those it follows
        is written for the replica that may take over."""
        now = utcnow()
        until = now + timedelta(seconds=max(LEASE_PASSES * self.period, LEASE_SECONDS))
        self._sent = {k: v for k, v in self._sent.items() if k in logged}
        async with self._maker() as session, session.begin():
            await repository.logs_sent(session, self._sent, self._owner)
            return await repository.follow_logs(session, logged, self._owner, now, until)

    async def stop(self) -> None:
        """End the followers, and give up their leases with the last line sent of each, so
        another replica carries on from there at once."""
        await super().stop()
        if self._sent:
            async with self._maker() as session, session.begin():
                await repository.logs_sent(session, self._sent, self._owner, release=True)
            self._sent.clear()

    def _start(self, row: Exported) -> None:
        if len(self.following) >= self.limit and row.task_id not in self.following:
            self._exports.drops.add("log_followers_full")
            return
        self.following[row.task_id] = asyncio.create_task(
            self._follow(row), name=f"telemetry-task-logs-{row.task_id}"
        )

    @staticmethod
    def _logs(row: Exported) -> bool:
        return _names(row.seen.telemetries, Kind.LOGS)

    async def _follow(self, row: Exported) -> None:
        """Follow the task's containers while its objects are on its cluster (again, from
        the last line, when a follow ends and they still are); once they left, send the lines
        kept as they left that came after the last one sent (a follow can end before it read
        a container's last lines)."""
        last = self._sent.get(row.task_id, "")
        #: (pod, container) -> the last text sent of it
        sent: dict[tuple[str, str], str] = {}
        while row.task_id in self._wanted:
            adapter = self._adapters.get(row.cluster or "")
            async with self._maker() as session:
                task = await repository.get(session, row.task_id)
            if adapter is None or task is None or adds_collector(adapter):
                return
            masker = Masker(self._tasks.secrets_of(task).values())
            since = None
            if last:
                since = max(1, int((time.time_ns() - time_of(last, time.time_ns())) / 1e9) + 1)
            request = LogRequest(timestamps=True, follow=True, since_seconds=since)
            try:
                async for line in adapter.logs(instance_of(task), request):
                    if last and line.timestamp and line.timestamp <= last:
                        continue  # sent before the follow ended
                    last = line.timestamp or last
                    self._sent[row.task_id] = last
                    text = cut(masker(line.text))  # masked whole, then cut
                    sent[(line.pod, line.container)] = text
                    self._hand(row, line.pod, line.container, text, line.timestamp)
            except AdapterError as exc:
                log.info("following the logs of task %s: %s", row.task_id, exc.message)
            await asyncio.sleep(self.period)
        adapter = self._adapters.get(row.cluster or "")
        if adapter is None or adds_collector(adapter):
            return
        async with self._maker() as session:
            task = await repository.get(session, row.task_id)
        for entry in (task.kept_logs or []) if task is not None else []:
            if entry.get("previous"):
                continue
            key = (str(entry.get("pod", "")), str(entry.get("container", "")))
            lines = [str(text) for text in entry.get("lines") or []]
            if key in sent and sent[key] in lines:
                lines = lines[len(lines) - lines[::-1].index(sent[key]) :]
            for text in lines:
                self._hand(row, *key, text, "")

    def _hand(self, row: Exported, pod: str, container: str, text: str, stamp: str) -> None:
        """One line to the export's bounded queue (never blocks: a full queue drops it)."""
        seen = row.seen
        line = TaskLine(
            seen.account,
            "",
            "",
            seen.task_id,
            pod,
            container,
            text,
            time_of(stamp, time.time_ns()),
            task_name=seen.name,
        )
        self._exports.invocation(TaskLogged(seen.account, seen.task_id, seen.telemetries, (line,)))


__all__ = ["TaskExports", "exported"]
