"""The reconciler's loop (runtime.md §3): what is due, as units of work, until stopped.

A loop service of the server (core/loops.py), driven only by the database. It wakes on `wake()`
(the API calls it after committing a change) and otherwise every `interval` seconds or at the next
health timer of an instance it drives, or when an adapter's change feed has news (a watch
event, a step of the simulated timeline: backends/changes.py). A pass first makes the
instances the feeds report changed due, then reads what is due — deployments whose desired
state changed or that have not settled, instances due for a health check, a change or their
safety-net resync (resync.py: a long period, spread evenly; everything at start-up and on a
cluster whose watch was re-established) — and nothing else, so an idle fleet costs nothing
per pass. Running instances that are due only for
a resync or a health check, not reported changed, and whose lease this process holds or held
last (expired, nobody else claimed them) are re-observed without a database round trip;
everything else goes to units of work (unit.py) in batches.

Durability: all state is in the database. An Instance row exists (and is committed) before its
objects are applied and `applied` is set before the apply call, so after a restart an applied
instance whose backend has forgotten it (the in-memory simulated cluster) is applied again;
apply is idempotent. Leases (`lease_owner`, `lease_expires_at`) stop two replicas from
driving the same instance; deployment-level decisions (instance counts, status) are taken
under the deployment row lock on PostgreSQL. SQLite has a single writer, so units run one at
a time there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.backends.changes import ChangeFeed
from service.backends.protocol import AdapterError
from service.clusters.adapters import AdapterRegistry
from service.clusters.catalog import Catalog
from service.core.crypto import SecretBox
from service.core.db import utcnow
from service.core.loops import LoopService
from service.core.tracing import NO_TRACING, Tracing
from service.deployments.logs.keep import restart_counts, restarted
from service.deployments.metrics import ReconcileMetrics
from service.deployments.models import InstanceDesired
from service.deployments.reconcile.config import ReconcilerConfig
from service.deployments.reconcile.drain import Activity
from service.deployments.reconcile.owner import OwnerId, fresh_owner
from service.deployments.reconcile.placement import CapacityView
from service.deployments.reconcile.resync import next_resync
from service.deployments.reconcile.store import DueInstance, ReconcileStore
from service.deployments.reconcile.unit import UnitOfWork
from service.deployments.reconcile.work import Clock, Memory, Runtime
from service.health.machine import InstanceCondition, Phase, evaluate

log = logging.getLogger("nvcf.reconciler")

#: deployments read per pass at most (the rest are due on the next pass)
PASS_LIMIT = 10_000


@dataclass
class PassReport:
    """What one pass did: deployments due, re-observed without a unit of work (resynced),
    reconciled in units, and units that raised."""

    deployments: int = 0
    resynced: int = 0
    reconciled: int = 0
    errors: int = 0


class Reconciler(LoopService[str]):
    """Converges deployments; `start()`/`stop()` run it as a task, `run_once()` is one pass."""

    def __init__(
        self,
        sessionmaker: async_sessionmaker[AsyncSession],
        registry: AdapterRegistry,
        catalog: Catalog,
        *,
        config: ReconcilerConfig | None = None,
        secret_box: SecretBox | None = None,
        clock: Clock | None = None,
        owner: OwnerId | None = None,
        metrics: ReconcileMetrics | None = None,
        tracing: Tracing = NO_TRACING,
        activity: Activity | None = None,
    ) -> None:
        self.config = config or ReconcilerConfig()
        #: the invocation plane's requests in flight, for drains (drain.py); set by the app
        self.activity = activity
        self.metrics = metrics if metrics is not None else ReconcileMetrics()
        self.tracing = tracing
        self._owner = owner or fresh_owner()
        self.store = ReconcileStore(sessionmaker, self._owner.value, self.config.lease_seconds)
        self.memory = Memory()
        self.registry = registry
        self.catalog = catalog
        self.secret_box = secret_box
        self._clock = clock or utcnow
        super().__init__(
            "nvcf-reconciler",
            self.run_once,
            self._sleep_seconds,
            log=log,
            failure="reconciliation pass failed",
        )
        #: held during a pass; the namespace collector runs between passes
        self.pass_lock = asyncio.Lock()
        self.passes = 0
        #: called when an instance became Running (set by the app: the invocation plane)
        self.on_running: Callable[[], None] | None = None
        self.on_draining: Callable[[uuid.UUID], None] | None = None
        #: called with every change the feeds reported (the ids as the adapters know them,
        #: and whether a feed asked for a full re-observation): the task loop's are there too,
        #: and it answers which ids are its own, which no instance has
        self.on_changes: Callable[[set[str], bool], Collection[str]] | None = None
        self._order = random.Random(self.store.owner)  # noqa: S311 - an order, not a secret
        #: the first pass re-observes every instance (the feeds say nothing about the past)
        self._resync_all = True

    @property
    def owner(self) -> str:
        return self.store.owner

    def _runtime(self) -> Runtime:
        return Runtime(
            sessionmaker=self.store.sessionmaker,
            registry=self.registry,
            catalog=self.catalog,
            config=self.config,
            store=self.store,
            clock=self._clock,
            memory=self.memory,
            secret_box=self.secret_box,
            wake=self.wake,
            on_running=self.on_running,
            on_draining=self.on_draining,
            activity=self.activity,
        )

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if not self.running:
            for _, adapter in self.registry.items():
                if isinstance(adapter, ChangeFeed):
                    adapter.watch_changes(self.wake)
        super().start()

    async def stop(self) -> None:
        """Stop the loop (an interrupted unit is resumed from the database later)."""
        await super().stop()
        try:
            await self.store.release_leases()
        except Exception:
            log.exception("releasing the reconciler's leases failed")
        self._owner.close()

    def _sleep_seconds(self) -> float:
        wait = self.config.interval
        now = self._clock()
        if self.memory.next_check:
            due = min(self.memory.next_check.values())
            wait = min(wait, (due - now).total_seconds())
        for _, adapter in self.registry.items():
            if isinstance(adapter, ChangeFeed):
                step = adapter.next_change()
                if step is not None:
                    wait = min(wait, (step - now).total_seconds())
        return max(wait, 0.01)

    async def request_resync(self) -> int:
        """Make every wanted instance due now, so the next pass re-observes all of them (e.g.
        after a cluster was restored); the number of instances made due."""
        return await self.store.all_due(self._clock())

    async def _take_changes(self, now: datetime) -> set[uuid.UUID]:
        """Make due what the adapters' change feeds report: the changed instances, or every
        instance of a cluster whose feed may have missed changes (and all at start-up); the
        instances reported changed."""
        changed: list[uuid.UUID] = []
        resync: list[str] = []
        reported: set[str] = set()
        for name, adapter in self.registry.items():
            if not isinstance(adapter, ChangeFeed):
                continue
            changes = adapter.take_changes(now)
            if changes.resync:
                resync.append(name)
            reported |= changes.instance_ids
        if self.on_changes is not None and (reported or resync or self._resync_all):
            # a task's changes are the task loop's: no instance is made due for them
            reported = reported - set(self.on_changes(reported, bool(resync) or self._resync_all))
        for instance_id in reported:
            with contextlib.suppress(ValueError):
                changed.append(uuid.UUID(instance_id))
        if self._resync_all:
            self._resync_all = False
            await self.store.resync_due(now)
        elif resync:
            log.info("re-observing every instance of %s (its watch was re-established)", resync)
            await self.store.resync_due(now, resync)
        if changed:
            await self.store.mark_due(changed, now)
        return set(changed)

    # ------------------------------------------------------------------ one pass

    async def run_once(self) -> PassReport:
        """One pass over what is due."""
        async with self.pass_lock:
            started = time.perf_counter()
            try:
                return await self._pass()
            finally:
                self.metrics.pass_seconds.observe(time.perf_counter() - started)

    async def _pass(self) -> PassReport:
        self.passes += 1
        now = self._clock()
        changed = await self._take_changes(now)
        due_deployments, due_instances = await self.store.due(now, PASS_LIMIT)
        full = [d for d in due_deployments if d not in self.memory.busy]
        report = PassReport(deployments=len(due_deployments))
        resyncs = self._classify(due_instances, set(due_deployments), full, now, changed)
        renewed: dict[uuid.UUID, datetime] = {}
        for dep_id, instances in resyncs.items():
            try:
                due = await self._resync(instances, now)
            except Exception:
                log.exception("re-observing deployment %s failed", dep_id)
                due = None
            if due is None:
                full.append(dep_id)
            else:
                report.resynced += 1
                renewed.update(due)
        if renewed:
            await self.store.renew(renewed, self._clock())
        if full:
            # A span only for passes with units of work: idle passes would flood traces.
            with self.tracing.span("reconcile.pass", {"nvcf.deployments": len(full)}):
                await self._units(full, report)
        return report

    def _classify(
        self,
        due: list[DueInstance],
        due_deployments: set[uuid.UUID],
        full: list[uuid.UUID],
        now: datetime,
        changed: set[uuid.UUID],
    ) -> dict[uuid.UUID, list[uuid.UUID]]:
        """Sort due instances into re-observations this process can do on its own (by
        deployment) and deployments that need a unit of work (appended to `full`): those of
        instances a change feed reported changed (`changed`) go to a unit at once."""
        resyncs: dict[uuid.UUID, list[uuid.UUID]] = defaultdict(list)
        needs_unit: set[uuid.UUID] = set()
        for inst in due:
            dep = inst.deployment_id
            if dep in due_deployments or dep in self.memory.busy:
                continue
            leased = inst.lease_expires_at is not None and inst.lease_expires_at > now
            if inst.lease_owner not in (None, self.owner) and leased:
                self.memory.forget([inst.id])
                continue  # another replica drives it
            # Still ours even when the lease has run out since (a safety-net resync comes
            # long after it): nobody claimed it meanwhile, and `renew` extends it only if
            # nobody claims it before; a re-observation itself writes nothing.
            if (
                inst.desired == InstanceDesired.PRESENT
                and inst.phase == Phase.RUNNING
                and inst.lease_owner == self.owner
                and inst.id in self.memory.resync
                and inst.id not in changed
            ):
                resyncs[dep].append(inst.id)
            else:
                needs_unit.add(dep)
        full.extend(needs_unit)
        return {d: ids for d, ids in resyncs.items() if d not in needs_unit}

    async def _resync(
        self, instance_ids: list[uuid.UUID], started: datetime
    ) -> dict[uuid.UUID, datetime] | None:
        """Re-observe Running instances without touching the database: when each is due next,
        or None when something changed (or failed) and the deployment needs a unit of work.
        The next resync is the instance's slot (resync.py)."""
        period = self.config.resync_seconds
        due: dict[uuid.UUID, datetime] = {}
        for inst_id in instance_ids:
            target, mode, previous = self.memory.resync[inst_id]
            adapter = self.registry.get(target.cluster)
            if adapter is None:
                return None
            try:
                observed = await adapter.observe(target)
            except AdapterError:
                return None
            await asyncio.sleep(0)  # an in-process backend answers without yielding
            now = self._clock()
            cond = evaluate(
                observed,
                InstanceCondition.from_json(previous),
                now,
                self.config.timeouts,
                mode,
            )
            if cond.to_json() != previous:
                return None
            counts = restart_counts(observed)
            if restarted(self.memory.restarts.get(inst_id), counts):
                return None  # a unit of work keeps the run that ended
            self.memory.restarts[inst_id] = counts
            due[inst_id] = next_resync(inst_id, started, period)
            if cond.next_check is not None:
                self.memory.next_check[inst_id] = cond.next_check
                due[inst_id] = min(due[inst_id], cond.next_check)
            else:
                self.memory.next_check.pop(inst_id, None)
        return due

    async def _units(self, deployment_ids: list[uuid.UUID], report: PassReport) -> None:
        rt = self._runtime()
        view = CapacityView(self.registry)
        # Batch only what would otherwise wait for a free slot: with several slots, a few
        # batches per slot keep the slots busy and leave work for other replicas. Each replica
        # takes the due deployments in its own order, so replicas mostly claim different
        # batches instead of skipping each other's locks.
        deployment_ids = sorted(deployment_ids)
        self._order.shuffle(deployment_ids)
        concurrency = max(1, self.config.concurrency)
        spread = 1 if concurrency == 1 else concurrency * 4
        size = max(1, min(self.config.batch_size, -(-len(deployment_ids) // spread)))
        batches = [deployment_ids[i : i + size] for i in range(0, len(deployment_ids), size)]
        gate = asyncio.Semaphore(concurrency)

        async def run(batch: list[uuid.UUID]) -> bool:
            self.memory.busy.update(batch)
            try:
                with self.tracing.span("reconcile.unit", {"nvcf.deployments": len(batch)}):
                    await UnitOfWork(rt, batch, view).run()
                self.metrics.unit_done(ok=True)
                return True
            except asyncio.CancelledError:
                raise
            except Exception:
                self.metrics.unit_done(ok=False)
                if len(batch) == 1:
                    report.errors += 1
                    log.exception("reconciling deployment %s failed", batch[0])
                else:
                    log.warning(
                        "a unit of %d deployments failed; retrying them one by one",
                        len(batch),
                        exc_info=True,
                    )
                return False
            finally:
                self.memory.busy.difference_update(batch)

        async def unit(batch: list[uuid.UUID]) -> None:
            async with gate:
                if await run(batch):
                    report.reconciled += len(batch)
                    return
                if len(batch) > 1:
                    # One bad deployment must not hold back the others of its batch.
                    for dep_id in batch:
                        if await run([dep_id]):
                            report.reconciled += 1

        await asyncio.gather(*(unit(b) for b in batches))
