"""In-process export of the platform's per-function signals to the tenant's telemetry endpoints
(the embedded default and the simulated clusters; on Kubernetes a collector sidecar does it).

The invocation plane hands each answered invocation of a version naming telemetries (an
`Invocation`, with its phases and trace ids, events.py) and an LLM invocation's `Tokens` to
`Exports.invocation`; the deployments' side (deployments/exported.py) hands the lines of the
instances it follows (`Logged`) and the instances by phase (`Phased`). The request path only
appends to a bounded buffer (full: dropped and counted) what makes the event — the event itself
is built later — and wakes nothing. A task drains the buffer every DRAIN_PERIOD, a chunk at a
time, finds each named telemetry's `Pipeline` (pipeline.py: loaded from the database, the
telemetry's account checked against the function's, the key decrypted) and records the event
there: spans on its traces endpoint, counters, histograms and gauges on its metrics endpoint,
lines on its logs endpoint. An endpoint whose last export failed is in backoff
(endpoints.py): its signals are counted as dropped and nothing is built, encoded or sent until
the backoff ends. The OpenTelemetry SDK's batch processor and periodic reader, and the log
batcher, export from their own threads, so a slow or dead endpoint never holds the event loop;
their queues are bounded and a failed batch is dropped (counted).

Every connection of an OTLP/HTTP export goes through `EndpointGuard` (endpoints.py): the host
is resolved and each address checked as at creation (charts/netguard.py pins the checked
addresses), redirects are not followed, and each request is bounded in time and size. A gRPC
channel goes only to the addresses checked when its pipeline was built (gRPC would otherwise
resolve again). Each telemetry's last success and last error (the endpoint's HTTP status, or
why nothing answered) are written back to it.

Nothing is done for a version that names no telemetry: the plane checks its target's
`telemetries` before calling here.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.core.crypto import SecretBox
from service.observability import repository
from service.observability.endpoints import Drops
from service.observability.events import Event, Phased, TaskSeen, Watched
from service.observability.models import Kind, Telemetry
from service.observability.pipeline import ExportSettings, Pipeline, build_pipeline
from service.observability.references import FIELDS
from service.observability.service import key_of

log = logging.getLogger("nvcf.observability")

#: how long a loaded pipeline is used before its telemetry is read again (a new key, deleted)
PIPELINE_TTL = 30.0
#: seconds between two drains of the buffer (at most: the export interval)
DRAIN_PERIOD = 0.25
#: events recorded before the drain lets the event loop run others
CHUNK = 64
#: what the request path leaves in the buffer: a function making the event, and its arguments
Pending = tuple[Callable[..., Event], tuple[Any, ...]]


def _each(pipelines: Sequence[Pipeline], action: Callable[[Pipeline], None]) -> None:
    for pipeline in pipelines:
        action(pipeline)


def _same(event: Event) -> Event:
    return event


class Exports:
    """The process's export of per-function signals (one queue, one task)."""

    def __init__(
        self,
        maker: async_sessionmaker[AsyncSession],
        box: SecretBox,
        settings: ExportSettings,
        drops: Drops,
    ) -> None:
        self._maker = maker
        self._box = box
        self.settings = settings
        self.drops = drops
        self._pending: deque[Pending] = deque()
        #: one drain at a time (the task's or a flush's)
        self._draining = asyncio.Lock()
        #: one pipeline load at a time: two lookups of a telemetry at once would each build
        #: one, and the one replaced would go on exporting, its connections never closed
        self._loading = asyncio.Lock()
        #: stopped: a load finishing after `stop` shuts its pipeline down at once
        self._stopped = False
        #: one status write at a time: a write that took a status commits it before another
        #: takes the next (a flush returns with what it exported written, and a newer status
        #: is never overwritten by an older one committing late)
        self._writing = asyncio.Lock()
        #: a version's telemetries as stored -> the telemetries named and for what
        self._named: dict[tuple[tuple[str, str], ...], list[tuple[uuid.UUID, set[Kind]]]] = {}
        #: telemetry id -> (when it was read, its pipeline or None)
        self._pipelines: dict[uuid.UUID, tuple[float, Pipeline | None]] = {}
        self._task: asyncio.Task[None] | None = None
        #: version id -> its load, for the gauges (a later record of a version replaces it)
        self._watched: dict[str, Watched] = {}
        #: the last snapshot of instances by phase (the deployments' side refreshes it)
        self._phases: Sequence[Phased] = ()
        #: the last snapshot of the tasks naming telemetries (the task exports refresh it)
        self._tasks: Sequence[TaskSeen] = ()
        self._unloaded = False

    def phases(self, snapshot: Sequence[Phased]) -> None:
        """The versions naming a metrics telemetry and their instances by phase, now; each
        version's pipelines are loaded if they are not yet (never blocks)."""
        self._phases = tuple(snapshot)
        self._unloaded = True  # the export task loads their pipelines (no room in the queue)

    def _phase_snapshot(self) -> Sequence[Phased]:
        return self._phases

    def tasks(self, snapshot: Sequence[TaskSeen]) -> None:
        """The tasks naming telemetries, now (their METRICS telemetries' gauges read it);
        their metrics pipelines are loaded if they are not yet (never blocks)."""
        self._tasks = tuple(snapshot)
        self._unloaded = True

    def _task_snapshot(self) -> Sequence[TaskSeen]:
        return self._tasks

    def watch(self, watched: Watched) -> None:
        """Read a version's load in its telemetries' gauges (the load tracker's new record)."""
        self._watched[watched.version_id] = watched

    def _loads(self) -> Sequence[Watched]:
        # the SDK's reader thread takes a copy (the loop may add a record meanwhile)
        return list(self._watched.values())

    def forget(self, telemetry_id: uuid.UUID) -> None:
        """The telemetry changed (a new key): its pipeline is read again before its next
        record or gauge export, so the next export sends the new key."""
        loaded = self._pipelines.get(telemetry_id)
        if loaded is not None:
            self._pipelines[telemetry_id] = (float("-inf"), loaded[1])
            self._unloaded = True

    def invocation(self, event: Event) -> None:
        """Queue an event; never blocks (a full buffer drops it, counted)."""
        self.later(_same, event)

    def later(self, make: Callable[..., Event], *args: Any) -> None:
        """Queue the event `make(*args)` will build when the buffer is drained (the request
        path's part is this append); never blocks (a full buffer drops it, counted)."""
        if len(self._pending) >= self.settings.queue_size:
            self.drops.add("queue_full")
            return
        self._pending.append((make, args))

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="telemetry-export")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        try:
            await self._drain()
        except Exception:  # the database may be gone: what is buffered is lost
            log.exception("telemetry export: recording the last invocations failed")
        async with self._loading:  # a load its caller left (cancelled) has stored its pipeline
            self._stopped = True
            pipelines = self._live()
            self._pipelines.clear()
        await asyncio.to_thread(_each, pipelines, Pipeline.shutdown)
        await self._write_statuses(pipelines)

    async def flush(self) -> None:
        """Record what is queued and export what is recorded now, then write the statuses
        back (tests; shutdown does the same)."""
        await self._drain()
        pipelines = self._live()
        millis = int(self.settings.timeout * 1000)
        await asyncio.to_thread(_each, pipelines, lambda p: p.flush(millis))
        await self._write_statuses(pipelines)

    async def _run(self) -> None:
        period = min(self.settings.interval, 5.0)
        drain = min(self.settings.interval, DRAIN_PERIOD)
        written = time.monotonic()
        while True:
            if self._unloaded:
                self._unloaded = False
                await self._load_phases()
            await asyncio.sleep(drain)
            await self._drain()
            if time.monotonic() - written >= period:
                written = time.monotonic()
                try:  # shielded: a stop meanwhile waits for it, the statuses it took written
                    await asyncio.shield(self._write_statuses(self._live()))
                except Exception:  # the database away: written at the next period
                    log.exception("telemetry export: writing the statuses failed")

    async def _drain(self) -> None:
        """Build and record every buffered event, CHUNK at a time."""
        async with self._draining:
            while self._pending:
                for _ in range(min(CHUNK, len(self._pending))):
                    make, args = self._pending.popleft()
                    try:
                        await self._record(make(*args))
                    except Exception:  # one bad event never stops the export of the others
                        log.exception("telemetry export: recording an invocation failed")
                await asyncio.sleep(0)

    async def _load_phases(self) -> None:
        """The pipelines of the metrics telemetries the phase snapshot names, so that their
        gauges are read before any invocation of those versions."""
        field = next(f for f, k in FIELDS.items() if k is Kind.METRICS)
        named: list[Phased | TaskSeen] = [*self._phases, *self._tasks]
        for phased in named:
            if not phased.telemetries.get(field):
                continue
            try:
                await self.pipeline(uuid.UUID(str(phased.telemetries[field])))
            except Exception:  # a bad reference loads nothing, the others still load
                log.exception("telemetry export: loading a pipeline failed")

    def _named_by(self, telemetries: Mapping[str, str]) -> list[tuple[uuid.UUID, set[Kind]]]:
        """The telemetries a version's `telemetries` name, each with what it receives."""
        key = tuple(telemetries.items())
        named = self._named.get(key)
        if named is None:
            by_id: dict[uuid.UUID, set[Kind]] = {}
            for name, value in key:
                kind = FIELDS.get(name)
                if kind is not None:
                    by_id.setdefault(uuid.UUID(str(value)), set()).add(kind)
            if len(self._named) >= 4096:  # versions come and go: bounded, rebuilt as read
                self._named.clear()
            named = self._named[key] = list(by_id.items())
        return named

    def failing(self, telemetries: Mapping[str, str], kind: Kind) -> bool:
        """Whether a telemetry receiving the version's `kind` is in backoff (its last export
        failed): what would go there now is only dropped (never blocks, reads no database)."""
        for telemetry_id, kinds in self._named_by(telemetries):
            if kind in kinds:
                _, pipeline = self._pipelines.get(telemetry_id, (None, None))
                if pipeline is not None and pipeline.status.failing():
                    return True
        return False

    async def _record(self, event: Event) -> None:
        for telemetry_id, kinds in self._named_by(event.telemetries):
            pipeline = await self.pipeline(telemetry_id)
            # nothing of one account ever goes to another's endpoint
            if pipeline is not None and pipeline.account == event.account:
                pipeline.record(kinds, event)

    async def pipeline(self, telemetry_id: uuid.UUID) -> Pipeline | None:
        """The telemetry's pipeline, read again after PIPELINE_TTL (a new key rebuilds it; a
        deleted telemetry has none)."""
        loaded, known = self._pipelines.get(telemetry_id, (None, None))
        if loaded is not None and time.monotonic() - loaded < PIPELINE_TTL:
            return known
        # shielded: a caller cancelled mid-build (the export task at shutdown) must not leave
        # the pipeline built in its thread unstored, exporting for good with no one to stop it
        return await asyncio.shield(self._load(telemetry_id))

    async def _load(self, telemetry_id: uuid.UUID) -> Pipeline | None:
        async with self._loading:
            if self._stopped:
                return None
            return await self._loaded(telemetry_id)

    async def _loaded(self, telemetry_id: uuid.UUID) -> Pipeline | None:
        loaded, known = self._pipelines.get(telemetry_id, (None, None))
        now = time.monotonic()
        if loaded is not None and now - loaded < PIPELINE_TTL:
            return known  # loaded while this lookup waited
        async with self._maker() as session:
            row = await repository.by_id(session, telemetry_id)
        if known is not None and row is not None and row.updated_at == known.updated_at:
            self._pipelines[telemetry_id] = (now, known)
            return known
        if known is not None:
            await asyncio.to_thread(known.shutdown)
        pipeline = None
        if row is not None:
            key = key_of(row, self._box)
            if key is not None:
                pipeline = await asyncio.to_thread(
                    build_pipeline,
                    row,
                    key,
                    self.settings,
                    self.drops,
                    self._loads,
                    self._phase_snapshot,
                    self._task_snapshot,
                )
        self._pipelines[telemetry_id] = (now, pipeline)
        return pipeline

    def _live(self) -> list[Pipeline]:
        return [p for _, p in self._pipelines.values() if p is not None]

    async def _write_statuses(self, pipelines: Sequence[Pipeline]) -> None:
        async with self._writing:
            await self._write_taken(pipelines)

    async def _write_taken(self, pipelines: Sequence[Pipeline]) -> None:
        changes = [(p.telemetry_id, s) for p in pipelines if (s := p.status.take()) is not None]
        if not changes:
            return
        async with self._maker() as session, session.begin():
            for telemetry_id, (success, error_at, error, dropped) in changes:
                await session.execute(
                    update(Telemetry)
                    .where(Telemetry.id == telemetry_id)
                    .values(
                        last_success_at=success,
                        last_error_at=error_at,
                        last_error=error,
                        dropped=Telemetry.dropped + dropped,
                    )
                )
