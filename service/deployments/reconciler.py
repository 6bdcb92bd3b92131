"""The deployment reconciler (runtime.md §3–6): converges stored desired state onto the clusters.

An asyncio task of the server, driven only by the database. It wakes on `wake()` (the API
calls it after committing a change) and otherwise every `reconcile_interval` seconds. A pass:

1. reads every deployment's (id, generation, desired) and every instance's light columns in two
   queries, and skips deployments with nothing to do: same generation as when they last
   settled, every instance Running, observed less than `resync_seconds` ago and no health
   timer due;
2. reconciles each remaining deployment as one unit of work with its own sessions:
   T1 (short transaction) locks the deployment row (`FOR UPDATE SKIP LOCKED` on PostgreSQL),
   claims the leases of its instances with one conditional UPDATE, creates the missing
   Instance rows (committed before anything is applied) and marks surplus ones absent;
   then, outside any transaction, places new instances (placement.py), records the placement
   (T2) and applies the install-time-mutated objects, observes every leased instance,
   evaluates its health and tears failed/absent ones down; T3 writes phases, conditions and
   events, aggregates the version status (status.py) and, for a deployment being deleted
   whose instances are all gone, removes its rows.

Durability: all state is in the database. An Instance row exists (and is committed) before its
objects are applied and `applied` is set before the apply call, so after a restart an applied
instance whose backend has forgotten it (the in-memory simulated cluster) is applied again;
apply is idempotent. Leases (`lease_owner`, `lease_expires_at`) stop two replicas from
driving the same instance; deployment-level decisions (instance counts, status) are taken
under the deployment row lock on PostgreSQL. SQLite has a single writer, so units run one at
a time there.

Garbage collection (`collect_garbage`, every `gc_seconds`, runs between passes): adapters that
can (`kubernetes`) delete the `sr-*` namespaces they labelled whose instance id is not in the
database, e.g. after an older database was restored or an instance was torn down while its
cluster was missing from the catalog. The id snapshot holds every Instance row of every
cluster, whatever its state (placed or not, being torn down, kept as failed history): a row is
committed before its cluster is recorded and before anything is applied, so every namespace of
a row that existed at snapshot time is spared, even one placed on this cluster after the
snapshot. Rows created after the snapshot are the only risk; this reconciler creates none
meanwhile (it collects between passes, never during one). Another replica could, in the
milliseconds between the snapshot and the adapter's namespace LIST; so the adapter spares
namespaces younger than `gc_min_age` (`NVCF_RECONCILE_GC_MIN_AGE_SECONDS`), and a collected
namespace whose instance exists right after collection is logged as an error (that instance
then typically fails on a missing object: replaced, or the version goes to ERROR if it never
got ACTIVE). A failing collection is
logged and never stops the reconciler.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import hashlib
import logging
import os
import socket
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol, runtime_checkable

from sqlalchemy import and_, delete, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.backends.protocol import AdapterError, BackendAdapter, InstanceSpec
from service.charts.mutate import mutate_for_install
from service.clusters.adapters import AdapterRegistry
from service.clusters.catalog import Catalog
from service.clusters.instance_types import InstanceType, InstanceTypeError, parse_instance_type
from service.core.crypto import SecretBox
from service.core.db import utcnow
from service.core.kube import instance_namespace, is_nvlink, namespace_instance_id
from service.core.settings import Settings
from service.deployments.events import record_event
from service.deployments.models import Deployment, DeploymentEvent, DeploymentSpec, Instance
from service.deployments.placement import CapacityView, place
from service.functions.models import FunctionVersion
from service.health.machine import (
    HealthMode,
    HealthTimeouts,
    InstanceCondition,
    Observation,
    Phase,
    evaluate,
)
from service.health.observed import ObservedState
from service.health.status import SpecProgress, VersionStatus, next_status
from service.registry.service import all_credentials

log = logging.getLogger("nvcf.reconciler")

Clock = Callable[[], datetime]

BACKEND_TIMER = "backend"
GC_HISTORY = 1000  # collected namespaces remembered in `Reconciler.collected`


@dataclass(frozen=True)
class ReconcilerConfig:
    """Tuning of the reconciler; `from_settings` maps the `NVCF_` settings onto it."""

    interval: float = 2.0
    lease_seconds: float = 60.0
    # A Running instance with no health timer pending is re-observed at most this often.
    resync_seconds: float = 10.0
    concurrency: int = 8
    timeouts: HealthTimeouts = field(default_factory=HealthTimeouts)
    # Failed instances kept per deployment (for the API's instances/healthInfo).
    failed_history: int = 10
    # Orphaned-namespace garbage collection: period (0 disables) and bound of one round.
    gc_seconds: float = 300.0
    gc_timeout: float = 60.0
    # Namespaces younger than this are never collected: another replica may have created
    # the instance after this one read the known ids.
    gc_min_age: float = 120.0

    @classmethod
    def from_settings(cls, settings: Settings) -> ReconcilerConfig:
        sqlite = settings.effective_database_url.startswith("sqlite")
        return cls(
            interval=settings.reconcile_interval,
            lease_seconds=settings.reconcile_lease_seconds,
            resync_seconds=settings.reconcile_resync_seconds,
            concurrency=1 if sqlite else settings.reconcile_concurrency,
            gc_seconds=settings.reconcile_gc_seconds,
            gc_min_age=settings.reconcile_gc_min_age_seconds,
            timeouts=HealthTimeouts(
                pod_scheduling=settings.health_pod_scheduling_timeout,
                image_pull=settings.health_image_pull_timeout,
                restart_loop=settings.health_restart_loop_timeout,
                init=settings.health_init_timeout,
                worker_startup=settings.health_worker_startup_timeout,
                worker_degradation=settings.health_worker_degradation_period,
                pending=settings.health_pending_timeout,
                failing_backoff=settings.health_failing_backoff,
                failing_recheck=min(30.0, settings.health_failing_backoff),
            ),
        )


@dataclass
class PassReport:
    """What one pass did: deployments seen, re-observed without a unit of work, reconciled
    (full units), and units that raised."""

    deployments: int = 0
    resynced: int = 0
    reconciled: int = 0
    errors: int = 0


@dataclass
class GarbageReport:
    """One garbage-collection round: namespaces whose deletion started, per cluster, and the
    clusters where collection failed (with the reason)."""

    collected: dict[str, list[str]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


@runtime_checkable
class GarbageCollecting(Protocol):
    """An adapter that can delete what it created for instances the service no longer knows."""

    name: str

    async def garbage_collect(
        self, known_instance_ids: Iterable[str], *, min_age_seconds: float = 0.0
    ) -> list[str]: ...


@dataclass
class _Work:
    """One leased instance during a unit: what was decided outside the transaction."""

    row: Instance
    spec: DeploymentSpec
    condition: InstanceCondition | None = None
    placed_on: str | None = None
    placement_event: str | None = None
    gone: bool = False  # torn down on the backend in this unit
    observed: bool = False
    target: InstanceSpec | None = None
    mode: HealthMode = "default"


def _new_owner() -> str:
    return f"{socket.gethostname()[:32]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _previous(row: Instance) -> InstanceCondition | None:
    if not row.condition:
        return None
    try:
        return InstanceCondition.from_json(row.condition)
    except (ValueError, KeyError, TypeError):
        return None


def _phase(value: str) -> Phase:
    try:
        return Phase(value)
    except ValueError:
        return Phase.SCHEDULING


def _is_empty(observed: ObservedState) -> bool:
    return not (observed.pods or observed.controllers or observed.present or observed.expected)


def _failed(
    reason: str, message: str, now: datetime, prev: InstanceCondition | None
) -> InstanceCondition:
    return InstanceCondition(
        phase=Phase.FAILED,
        reason=reason,
        message=message,
        since=now,
        ever_running=prev.ever_running if prev else False,
        ready_pods=prev.ready_pods if prev else frozenset(),
        observations=(Observation("Instance", reason, message),),
    )


def pull_secret_name(hostname: str, username: str) -> str:
    """A stable Secret name per registry credential (no credential text in the name)."""
    digest = hashlib.sha256(f"{hostname}\n{username}".encode()).hexdigest()
    return f"nvcf-pull-{digest[:16]}"


def dockerconfig(hostname: str, username: str, password: str) -> dict[str, Any]:
    auth = base64.b64encode(f"{username}:{password}".encode()).decode()
    return {"auths": {hostname: {"username": username, "password": password, "auth": auth}}}


class Reconciler:
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
        owner: str | None = None,
    ) -> None:
        self.sessionmaker = sessionmaker
        self.registry = registry
        self.catalog = catalog
        self.config = config or ReconcilerConfig()
        self.secret_box = secret_box
        self.owner = owner or _new_owner()
        self._clock = clock or utcnow
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        # In-memory only, to skip idle work; losing it (restart) merely costs one full pass.
        self._settled: dict[uuid.UUID, int] = {}
        self._observed_at: dict[uuid.UUID, datetime] = {}
        self._next_check: dict[uuid.UUID, datetime] = {}
        self._busy: set[uuid.UUID] = set()
        # Running instances re-observable without a database round trip: target, mode, and
        # the condition JSON as stored.
        self._resync_info: dict[uuid.UUID, tuple[InstanceSpec, HealthMode, dict[str, Any]]] = {}
        self.passes = 0
        # Garbage collection: when the next round is due (monotonic), the last round's report
        # and the namespaces collected since start (cluster, namespace), newest last.
        self._gc_due: float | None = None
        self.last_gc: GarbageReport | None = None
        self.collected: list[tuple[str, str]] = []

    # ------------------------------------------------------------------ lifecycle

    def wake(self) -> None:
        """Ask for a pass now (called by the API after it committed a change)."""
        self._wake.set()

    def start(self) -> None:
        if self._task is None:
            self._stopping = False
            self._task = asyncio.create_task(self._loop(), name="nvcf-reconciler")

    async def stop(self) -> None:
        """Stop the loop (an interrupted unit is resumed from the database later)."""
        self._stopping = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.release_leases()

    async def release_leases(self) -> None:
        """Give up this reconciler's leases so another replica can take over at once."""
        try:
            async with self.sessionmaker() as session, session.begin():
                await session.execute(
                    update(Instance)
                    .where(Instance.lease_owner == self.owner)
                    .values(lease_owner=None, lease_expires_at=None)
                )
        except Exception:
            log.exception("releasing the reconciler's leases failed")

    async def _loop(self) -> None:
        while not self._stopping:
            self._wake.clear()
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("reconciliation pass failed")
            await self._maybe_collect_garbage()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._sleep_seconds())

    def _sleep_seconds(self) -> float:
        wait = self.config.interval
        if self._next_check:
            due = min(self._next_check.values())
            wait = min(wait, (due - self._clock()).total_seconds())
        if self._gc_due is not None and self.config.gc_seconds > 0:
            wait = min(wait, self._gc_due - time.monotonic())
        return max(wait, 0.01)

    # ------------------------------------------------------------------ garbage collection

    async def _maybe_collect_garbage(self) -> None:
        """A garbage-collection round when one is due; never raises (but cancellation)."""
        if self.config.gc_seconds <= 0:
            return
        now = time.monotonic()
        if self._gc_due is not None and now < self._gc_due:
            return
        self._gc_due = now + self.config.gc_seconds
        try:
            await self.collect_garbage()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("garbage collection failed")

    async def collect_garbage(self) -> GarbageReport:
        """Delete orphaned instance namespaces on every adapter that supports it.

        Call it between passes (the loop does): see the module docstring for why the id
        snapshot is taken first and covers every cluster. One cluster's failure is recorded in
        the report and does not affect the others.
        """
        collectors = [a for _, a in self.registry.items() if isinstance(a, GarbageCollecting)]
        report = GarbageReport()
        if not collectors:
            self.last_gc = report
            return report
        known = await self._known_instance_ids()

        async def one(adapter: GarbageCollecting) -> None:
            try:
                collected = await asyncio.wait_for(
                    adapter.garbage_collect(known, min_age_seconds=self.config.gc_min_age),
                    self.config.gc_timeout,
                )
            except asyncio.CancelledError:
                raise
            except AdapterError as exc:
                report.errors[adapter.name] = exc.message
            except TimeoutError:
                report.errors[adapter.name] = f"timed out after {self.config.gc_timeout:g}s"
            except Exception as exc:
                log.exception("garbage collection on cluster %s failed", adapter.name)
                report.errors[adapter.name] = f"{type(exc).__name__}: {exc}"
            else:
                report.collected[adapter.name] = list(collected)

        await asyncio.gather(*(one(a) for a in collectors))
        for cluster, why in report.errors.items():
            log.warning("garbage collection on cluster %s failed: %s", cluster, why)
        collected = [(c, ns) for c, names in report.collected.items() for ns in names]
        for cluster, namespace in collected:
            log.warning(
                "garbage collection: deleting namespace %s on cluster %s (its instance is not "
                "in the database)",
                namespace,
                cluster,
            )
        if collected:
            self.collected = [*self.collected, *collected][-GC_HISTORY:]
            await self._check_collected(collected)
        self.last_gc = report
        return report

    async def _known_instance_ids(self) -> frozenset[str]:
        """Every instance id in the database, of every cluster and state."""
        async with self.sessionmaker() as session:
            ids = (await session.execute(select(Instance.id))).scalars()
            return frozenset(str(i) for i in ids)

    async def _check_collected(self, collected: Sequence[tuple[str, str]]) -> None:
        """Complain loudly about a collected namespace whose instance exists after all (created
        by another replica between the id snapshot and the adapter's listing)."""
        by_id = {namespace_instance_id(ns) or ns: (cluster, ns) for cluster, ns in collected}
        wanted: list[uuid.UUID] = []
        for text in by_id:
            with contextlib.suppress(ValueError):
                wanted.append(uuid.UUID(text))
        if not wanted:
            return
        async with self.sessionmaker() as session:
            found = (
                await session.execute(select(Instance.id).where(Instance.id.in_(wanted)))
            ).scalars()
            for inst_id in found:
                cluster, namespace = by_id[str(inst_id)]
                log.error(
                    "garbage collection raced with instance creation: namespace %s on cluster "
                    "%s belongs to instance %s, created meanwhile",
                    namespace,
                    cluster,
                    inst_id,
                )

    # ------------------------------------------------------------------ one pass

    async def run_once(self) -> PassReport:
        """One reconciliation pass over every deployment that may need work."""
        self.passes += 1
        now = self._clock()
        async with self.sessionmaker() as session:
            deployments = (
                await session.execute(
                    select(Deployment.id, Deployment.generation, Deployment.desired)
                )
            ).all()
            instances = (
                await session.execute(
                    select(
                        Instance.id,
                        Instance.deployment_id,
                        Instance.desired,
                        Instance.phase,
                        Instance.applied,
                        Instance.lease_owner,
                        Instance.lease_expires_at,
                    )
                )
            ).all()
        by_deployment: dict[uuid.UUID, list[Any]] = defaultdict(list)
        for row in instances:
            by_deployment[row.deployment_id].append(row)
        report = PassReport(deployments=len(deployments))
        todo: list[uuid.UUID] = []
        resyncs: list[tuple[uuid.UUID, list[uuid.UUID]]] = []
        for d in deployments:
            if d.id in self._busy:
                continue
            need = self._needs_work(d.generation, d.desired, d.id, by_deployment[d.id], now)
            if need is None:
                continue
            if need[0] == "resync":
                resyncs.append((d.id, need[1]))
            else:
                todo.append(d.id)
        self._forget(
            {d.id for d in deployments}, {i.id for i in instances if i.desired == "present"}
        )
        renewed: list[uuid.UUID] = []
        for dep_id, inst_ids in resyncs:
            try:
                unchanged = await self._resync(inst_ids)
            except Exception:
                log.exception("re-observing deployment %s failed", dep_id)
                unchanged = False
            if unchanged:
                report.resynced += 1
                renewed += inst_ids
            else:
                todo.append(dep_id)
        if renewed:
            await self._renew_leases(renewed)
        if not todo:
            return report
        view = CapacityView(self.registry)
        gate = asyncio.Semaphore(max(1, self.config.concurrency))

        async def unit(deployment_id: uuid.UUID) -> None:
            async with gate:
                self._busy.add(deployment_id)
                try:
                    await self.reconcile_deployment(deployment_id, view)
                    report.reconciled += 1
                except asyncio.CancelledError:
                    raise
                except Exception:
                    report.errors += 1
                    self._settled.pop(deployment_id, None)
                    log.exception("reconciling deployment %s failed", deployment_id)
                finally:
                    self._busy.discard(deployment_id)

        await asyncio.gather(*(unit(d) for d in todo))
        return report

    def _needs_work(
        self,
        generation: int,
        desired: str,
        deployment_id: uuid.UUID,
        instances: Sequence[Any],
        now: datetime,
    ) -> tuple[str, list[uuid.UUID]] | None:
        """None when idle; ("full", []) for a unit of work; ("resync", ids) when the only work
        is re-observing Running instances this reconciler holds a fresh lease on."""
        if desired != "deployed" or self._settled.get(deployment_id) != generation:
            return "full", []
        resync = timedelta(seconds=self.config.resync_seconds)
        due_ids: list[uuid.UUID] = []
        for inst in instances:
            if inst.desired != "present":
                if inst.applied:
                    return "full", []  # teardown pending
                continue
            if (
                inst.lease_owner not in (None, self.owner)
                and inst.lease_expires_at is not None
                and inst.lease_expires_at > now
            ):
                continue  # another replica drives it
            if inst.phase != Phase.RUNNING.value:
                return "full", []
            seen = self._observed_at.get(inst.id)
            next_check = self._next_check.get(inst.id)
            if (
                seen is None
                or now - seen >= resync
                or (next_check is not None and next_check <= now)
            ):
                lease_ok = (
                    inst.lease_owner == self.owner
                    and inst.lease_expires_at is not None
                    and inst.lease_expires_at > now
                )
                if not lease_ok or inst.id not in self._resync_info:
                    return "full", []
                due_ids.append(inst.id)
        return ("resync", due_ids) if due_ids else None

    async def _renew_leases(self, instance_ids: list[uuid.UUID]) -> None:
        """Extend this reconciler's leases on re-observed instances, in bulk."""
        expires = self._clock() + timedelta(seconds=self.config.lease_seconds)
        async with self.sessionmaker() as session, session.begin():
            for i in range(0, len(instance_ids), 500):
                await session.execute(
                    update(Instance)
                    .where(
                        Instance.id.in_(instance_ids[i : i + 500]),
                        Instance.lease_owner == self.owner,
                    )
                    .values(lease_expires_at=expires)
                    .execution_options(synchronize_session=False)
                )

    async def _resync(self, instance_ids: list[uuid.UUID]) -> bool:
        """Re-observe Running instances without touching the database; False when something
        changed (or failed) and the deployment needs a full unit of work."""
        for inst_id in instance_ids:
            target, mode, previous = self._resync_info[inst_id]
            adapter = self.registry.get(target.cluster)
            if adapter is None:
                return False
            try:
                observed = await adapter.observe(target)
            except AdapterError:
                return False
            now = self._clock()
            cond = evaluate(
                observed,
                InstanceCondition.from_json(previous),
                now,
                self.config.timeouts,
                mode,
            )
            if cond.to_json() != previous:
                return False
            self._observed_at[inst_id] = now
            if cond.next_check is not None:
                self._next_check[inst_id] = cond.next_check
            else:
                self._next_check.pop(inst_id, None)
        return True

    def _forget(self, deployments: set[uuid.UUID], instances: set[uuid.UUID]) -> None:
        for dep_id in [d for d in self._settled if d not in deployments]:
            del self._settled[dep_id]
        for cache in (self._observed_at, self._next_check, self._resync_info):
            for inst_id in [i for i in cache if i not in instances]:
                del cache[inst_id]

    # ------------------------------------------------------------------ one deployment

    async def reconcile_deployment(
        self, deployment_id: uuid.UUID, view: CapacityView | None = None
    ) -> None:
        """One unit of work: converge one deployment (see the module docstring)."""
        view = view or CapacityView(self.registry)
        loaded = await self._begin_unit(deployment_id)
        if loaded is None:
            return
        dep, version, work = loaded
        tearing_down = dep.desired != "deployed" or version is None
        mode: HealthMode = (
            "StatusByWorkerReadiness"
            if (dep.feature_flags or {}).get("StatusByWorkerReadiness")
            else "default"
        )
        pulled: list[list[tuple[str, dict[str, Any]]]] = []

        async def secrets() -> list[tuple[str, dict[str, Any]]]:
            """The account's pull secrets, read at most once per unit of work."""
            if not pulled:
                pulled.append(await self._pull_secrets(dep.account_id))
            return pulled[0]

        # Placement first (in spec preference order) so capacity goes to preferred specs.
        to_place = [
            w
            for w in work
            if not tearing_down and w.row.desired == "present" and w.row.cluster is None
        ]
        to_place.sort(key=lambda w: (w.spec.preferred_order, w.spec.position, w.row.created_at))
        placed: list[_Work] = []
        for w in to_place:
            await self._place(w, view)
            if w.placed_on is not None:
                placed.append(w)
        if placed:
            placed = await self._record_placements(dep, placed)
        fresh_ids = {w.row.id for w in placed}

        for w in work:
            row = w.row
            if tearing_down or row.desired != "present":
                if row.applied:
                    w.gone = await self._teardown(row, w.spec, dep)
                continue
            if w.condition is not None:  # decided during placement (unavailable cluster)
                continue
            if row.cluster is None:
                message = w.placement_event or "waiting for a cluster with free capacity"
                w.condition = self._evaluate(ObservedState.unplaced(message), row, mode)
                w.observed = True
                continue
            adapter = self.registry.get(row.cluster)
            if adapter is None:
                why = self.registry.unavailable_reason(row.cluster) or row.cluster
                w.condition = _failed("ClusterUnavailable", why, self._clock(), _previous(row))
            else:
                w.condition = await self._drive(
                    adapter, dep, version, w, mode, fresh=row.id in fresh_ids, secrets=secrets
                )
                w.observed = True
            if w.condition.phase is Phase.FAILED and row.applied:
                w.gone = await self._teardown(row, w.spec, dep)

        await self._finish_unit(dep.id, work)

    async def _begin_unit(
        self, deployment_id: uuid.UUID
    ) -> tuple[Deployment, FunctionVersion | None, list[_Work]] | None:
        """T1: lock the deployment, lease its instances, create/trim instance rows."""
        now = self._clock()
        expires = now + timedelta(seconds=self.config.lease_seconds)
        async with self.sessionmaker() as session, session.begin():
            dep = (
                await session.execute(
                    select(Deployment)
                    .where(Deployment.id == deployment_id)
                    .with_for_update(skip_locked=True)
                )
            ).scalar_one_or_none()
            if dep is None:
                return None  # gone, or another replica holds it right now
            version = await session.get(FunctionVersion, dep.version_id)
            await session.execute(
                update(Instance)
                .where(
                    Instance.deployment_id == dep.id,
                    or_(
                        Instance.lease_owner == self.owner,
                        Instance.lease_expires_at.is_(None),
                        Instance.lease_expires_at < now,
                    ),
                )
                .values(lease_owner=self.owner, lease_expires_at=expires)
                .execution_options(synchronize_session=False)
            )
            rows = list(
                (
                    await session.execute(
                        select(Instance)
                        .where(Instance.deployment_id == dep.id)
                        .order_by(Instance.created_at, Instance.id)
                    )
                ).scalars()
            )
            deploying = (
                dep.desired == "deployed"
                and version is not None
                and version.status != VersionStatus.ERROR.value
            )
            if deploying:
                rows += self._converge_counts(session, dep, rows, now, expires)
            specs = {s.id: s for s in dep.specs}
        work = [
            _Work(row=r, spec=specs[r.spec_id])
            for r in rows
            if r.lease_owner == self.owner and r.spec_id in specs
        ]
        return dep, version, work

    def _converge_counts(
        self,
        session: AsyncSession,
        dep: Deployment,
        rows: list[Instance],
        now: datetime,
        expires: datetime,
    ) -> list[Instance]:
        """Create instances up to each spec's minimum; mark the surplus absent."""
        created: list[Instance] = []
        for spec in dep.specs:
            present = [r for r in rows if r.spec_id == spec.id and r.desired == "present"]
            missing = spec.min_instances - len(present)
            for _ in range(missing):
                row = Instance(
                    id=uuid.uuid4(),
                    deployment_id=dep.id,
                    spec_id=spec.id,
                    account_id=dep.account_id,
                    cluster=None,
                    desired="present",
                    applied=False,
                    phase=Phase.SCHEDULING.value,
                    reason="Pending",
                    message="waiting for placement",
                    since=now,
                    condition=None,
                    lease_owner=self.owner,
                    lease_expires_at=expires,
                    created_at=now,
                    updated_at=now,
                )
                session.add(row)
                created.append(row)
                record_event(
                    session,
                    dep.id,
                    "instance",
                    f"instance {row.id} created for {spec.instance_type} "
                    f"({len(present) + len(created)}/{spec.min_instances})",
                    instance_id=row.id,
                    phase=row.phase,
                    reason="Created",
                )
            if missing < 0:
                # Scale down: drop instances that are not serving first, newest first.
                surplus = sorted(
                    present,
                    key=lambda r: (r.phase == Phase.RUNNING.value, r.created_at),
                )[:-missing]
                for row in surplus:
                    row.desired = "absent"
                    row.updated_at = now
                    record_event(
                        session,
                        dep.id,
                        "scaling",
                        f"instance {row.id} removed: minInstances of {spec.instance_type} "
                        f"is {spec.min_instances}",
                        instance_id=row.id,
                        phase=row.phase,
                        reason="ScaledDown",
                    )
        return created

    async def _place(self, w: _Work, view: CapacityView) -> None:
        try:
            it = parse_instance_type(w.spec.instance_type)
        except InstanceTypeError as exc:
            w.condition = _failed("InvalidInstanceType", str(exc), self._clock(), None)
            return
        placement = await place(
            view,
            [str(c) for c in w.spec.candidate_clusters or []],
            gpu=it.gpu,
            gpus_per_node=it.gpus_per_node,
            nodes=it.nodes,
        )
        if placement.cluster is not None:
            w.placed_on = placement.cluster
        elif placement.unavailable:
            w.condition = _failed(
                "ClusterUnavailable", placement.message, self._clock(), _previous(w.row)
            )
        else:
            w.placement_event = placement.message

    async def _record_placements(self, dep: Deployment, placed: list[_Work]) -> list[_Work]:
        """T2: persist cluster + applied before applying, so a crash never loses the objects."""
        now = self._clock()
        kept: list[_Work] = []
        async with self.sessionmaker() as session, session.begin():
            for w in placed:
                result = await session.execute(
                    update(Instance)
                    .where(Instance.id == w.row.id, Instance.lease_owner == self.owner)
                    .values(cluster=w.placed_on, applied=True, updated_at=now)
                    .execution_options(synchronize_session=False)
                )
                if getattr(result, "rowcount", 0) != 1:
                    continue  # lease lost meanwhile: the new owner places it
                w.row.cluster = w.placed_on
                w.row.applied = True
                kept.append(w)
                record_event(
                    session,
                    dep.id,
                    "instance",
                    f"instance {w.row.id} placed on cluster {w.placed_on}",
                    instance_id=w.row.id,
                    phase=w.row.phase,
                    reason="Placed",
                )
        return kept

    def _instance_spec(
        self, dep: Deployment, version: FunctionVersion | None, row: Instance, spec: DeploymentSpec
    ) -> InstanceSpec:
        it: InstanceType | None
        try:
            it = parse_instance_type(spec.instance_type)
        except InstanceTypeError:
            it = None
        return InstanceSpec(
            instance_id=str(row.id),
            function_id=str(dep.function_id),
            version_id=str(dep.version_id),
            instance_type=spec.instance_type,
            gpu=it.gpu if it else spec.gpu,
            gpus_per_node=it.gpus_per_node if it else 1,
            nodes=it.nodes if it else 1,
            cluster=row.cluster or "",
            deployment_id=str(dep.id),
            nca_id=dep.account_id,
            worker_service=version.helm_chart_service_name if version else None,
        )

    def _objects(
        self,
        dep: Deployment,
        row: Instance,
        spec: DeploymentSpec,
        secrets: Sequence[tuple[str, Mapping[str, Any]]],
    ) -> list[dict[str, Any]]:
        cluster = self.catalog.cluster(row.cluster or "")
        return mutate_for_install(
            [o for o in spec.objects if isinstance(o, dict)],
            namespace=instance_namespace(str(row.id)),
            instance_id=str(row.id),
            function_id=str(dep.function_id),
            version_id=str(dep.version_id),
            function_name=dep.function_name,
            nca_id=dep.account_id,
            instance_type=spec.instance_type,
            backend=spec.backend,
            region=cluster.region if cluster else "",
            pull_secrets=secrets,
            nvlink=cluster is not None and is_nvlink(cluster.attributes),
        )

    async def _pull_secrets(self, account_id: str) -> list[tuple[str, dict[str, Any]]]:
        if self.secret_box is None:
            return []
        async with self.sessionmaker() as session:
            creds = await all_credentials(session, account_id, box=self.secret_box)
        secrets = {
            pull_secret_name(host, user): dockerconfig(host, user, password)
            for host, user, password in creds
        }
        return sorted(secrets.items())

    async def _drive(
        self,
        adapter: BackendAdapter,
        dep: Deployment,
        version: FunctionVersion | None,
        w: _Work,
        mode: HealthMode,
        *,
        fresh: bool,
        secrets: Callable[[], Awaitable[list[tuple[str, dict[str, Any]]]]],
    ) -> InstanceCondition:
        """Apply (new instance, or one the backend forgot), observe, evaluate."""
        row, spec = w.row, w.spec
        target = self._instance_spec(dep, version, row, spec)
        w.target, w.mode = target, mode
        try:
            if fresh:
                await adapter.apply(target, self._objects(dep, row, spec, await secrets()))
            observed = await adapter.observe(target)
            if _is_empty(observed) and row.applied and not fresh:
                log.info(
                    "instance %s is unknown to cluster %s: applying again", row.id, row.cluster
                )
                await adapter.apply(target, self._objects(dep, row, spec, await secrets()))
                observed = await adapter.observe(target)
        except AdapterError as exc:
            return self._backend_error(row, exc)
        return self._evaluate(observed, row, mode)

    def _evaluate(
        self, observed: ObservedState, row: Instance, mode: HealthMode
    ) -> InstanceCondition:
        return evaluate(observed, _previous(row), self._clock(), self.config.timeouts, mode)

    def _backend_error(self, row: Instance, exc: AdapterError) -> InstanceCondition:
        """Non-retryable errors fail the instance; retryable ones after the failing backoff."""
        now = self._clock()
        prev = _previous(row)
        message = f"cluster {row.cluster}: {exc.message}"
        if not exc.retryable:
            return _failed("BackendError", message, now, prev)
        began = (prev.timers.get(BACKEND_TIMER) if prev else None) or now
        limit = self.config.timeouts.failing_backoff
        if (now - began).total_seconds() >= limit:
            return _failed("BackendError", f"{message} (failing for {limit:g}s)", now, prev)
        base = prev or InstanceCondition(
            phase=_phase(row.phase),
            reason="BackendError",
            message=message,
            since=now,
        )
        return dataclasses.replace(
            base,
            reason="BackendError",
            message=f"{message} (retrying)",
            timers={**base.timers, BACKEND_TIMER: began},
            next_check=began + timedelta(seconds=limit),
        )

    async def _teardown(self, row: Instance, spec: DeploymentSpec, dep: Deployment) -> bool:
        """Delete the instance's objects; True once the backend reports them gone."""
        if row.cluster is None:
            return True
        adapter = self.registry.get(row.cluster)
        if adapter is None:
            log.warning(
                "instance %s: %s; treating it as gone",
                row.id,
                self.registry.unavailable_reason(row.cluster),
            )
            return True
        try:
            return await adapter.delete(self._instance_spec(dep, None, row, spec))
        except AdapterError as exc:
            log.warning("deleting instance %s on %s failed: %s", row.id, row.cluster, exc.message)
            return False

    # ------------------------------------------------------------------ T3

    async def _finish_unit(self, deployment_id: uuid.UUID, work: list[_Work]) -> None:
        now = self._clock()
        settled = False
        wake = False
        async with self.sessionmaker() as session, session.begin():
            dep = (
                await session.execute(
                    select(Deployment).where(Deployment.id == deployment_id).with_for_update()
                )
            ).scalar_one_or_none()
            if dep is None:
                return
            version = await session.get(FunctionVersion, dep.version_id)
            rows = {
                r.id: r
                for r in (
                    await session.execute(select(Instance).where(Instance.deployment_id == dep.id))
                ).scalars()
            }
            failures: list[Instance] = []
            for w in work:
                row = rows.get(w.row.id)
                if row is None or row.lease_owner != self.owner:
                    continue
                if w.gone:
                    row.applied = False
                cond = w.condition
                if cond is not None:
                    self._write_condition(session, row, cond, now)
                    if cond.phase is Phase.FAILED and row.desired == "present":
                        row.desired = "absent"
                        failures.append(row)
                if w.observed:
                    self._observed_at[row.id] = now
                if (
                    w.target is not None
                    and row.desired == "present"
                    and row.phase == Phase.RUNNING.value
                    and row.condition is not None
                ):
                    self._resync_info[row.id] = (w.target, w.mode, row.condition)
                else:
                    self._resync_info.pop(row.id, None)
                if cond is not None and cond.next_check is not None:
                    self._next_check[row.id] = cond.next_check
                else:
                    self._next_check.pop(row.id, None)

            if dep.desired != "deployed" or version is None:
                await self._finish_delete(session, dep, version, rows, now)
                self._settled.pop(dep.id, None)
                return
            settled, wake = await self._aggregate(session, dep, version, rows, failures, now)
            await self._trim_history(session, dep.id, rows)
        if settled:
            self._settled[deployment_id] = dep.generation
        else:
            self._settled.pop(deployment_id, None)
        if wake:
            self.wake()

    def _write_condition(
        self, session: AsyncSession, row: Instance, cond: InstanceCondition, now: datetime
    ) -> None:
        data = cond.to_json()
        # Problems the health rules note but do not fail on (side objects in worker-readiness
        # mode, transient warnings) go on the timeline once each, so users can see them.
        seen = {
            (o.get("object"), o.get("reason"))
            for o in (row.condition or {}).get("observations", [])
            if isinstance(o, dict)
        }
        for obs in cond.observations:
            if (obs.object, obs.reason) not in seen:
                record_event(
                    session,
                    row.deployment_id,
                    "observation",
                    f"{obs.object}: {obs.message}",
                    instance_id=row.id,
                    phase=cond.phase.value,
                    reason=obs.reason,
                )
        if row.phase != cond.phase.value:
            record_event(
                session,
                row.deployment_id,
                "instance",
                f"instance {row.id} is {cond.phase.value}: {cond.message}",
                instance_id=row.id,
                phase=cond.phase.value,
                reason=cond.reason,
            )
        if (
            row.phase != cond.phase.value
            or row.reason != cond.reason
            or row.message != cond.message
            or row.condition != data
        ):
            row.phase = cond.phase.value
            row.reason = cond.reason
            row.message = cond.message
            row.since = cond.since
            row.condition = data
            row.updated_at = now

    async def _aggregate(
        self,
        session: AsyncSession,
        dep: Deployment,
        version: FunctionVersion,
        rows: Mapping[uuid.UUID, Instance],
        failures: list[Instance],
        now: datetime,
    ) -> tuple[bool, bool]:
        """Version status from the instances; returns (settled, wake again)."""
        present = [r for r in rows.values() if r.desired == "present"]
        progress = [
            SpecProgress(
                s.min_instances,
                sum(1 for r in present if r.spec_id == s.id and r.phase == Phase.RUNNING.value),
            )
            for s in dep.specs
        ]
        try:
            previous = VersionStatus(version.status)
        except ValueError:
            previous = VersionStatus.DEPLOYING
        status = next_status(
            previous, deployed=True, specs=progress, instance_failed=bool(failures)
        )
        wake = bool(failures)
        if status is not previous:
            reason = failures[0].reason if status is VersionStatus.ERROR and failures else None
            detail = f": {failures[0].message}" if reason and failures else ""
            result = await session.execute(
                update(FunctionVersion)
                .where(FunctionVersion.id == version.id, FunctionVersion.status == previous.value)
                .values(status=status.value, updated_at=now)
                .execution_options(synchronize_session=False)
            )
            if getattr(result, "rowcount", 0) == 1:
                record_event(
                    session,
                    dep.id,
                    "status",
                    f"function version status {previous.value} → {status.value}{detail}",
                    reason=reason,
                )
        if status is VersionStatus.ERROR:
            # The version failed while deploying: no retries, tear the others down.
            for r in present:
                r.desired = "absent"
                r.updated_at = now
                record_event(
                    session,
                    dep.id,
                    "teardown",
                    f"instance {r.id} torn down: the function version is in ERROR",
                    instance_id=r.id,
                    phase=r.phase,
                    reason="VersionError",
                )
                wake = True
            pending = any(r.applied for r in rows.values())
            return not pending and not present, wake
        counts_met = all(
            sum(1 for r in present if r.spec_id == s.id) == s.min_instances for s in dep.specs
        )
        all_running = all(
            r.phase == Phase.RUNNING.value
            or (r.lease_owner not in (None, self.owner) and r.lease_expires_at is not None)
            for r in present
        )
        teardown_pending = any(r.applied for r in rows.values() if r.desired != "present")
        return counts_met and all_running and not teardown_pending, wake

    async def _finish_delete(
        self,
        session: AsyncSession,
        dep: Deployment,
        version: FunctionVersion | None,
        rows: Mapping[uuid.UUID, Instance],
        now: datetime,
    ) -> None:
        """Undeploy / version delete: once every instance is gone, remove the records."""
        for row in rows.values():
            if row.desired == "present":
                row.desired = "absent"
        if any(r.applied for r in rows.values()):
            return  # some instance still exists on a backend (or another replica holds it)
        await session.execute(
            delete(DeploymentEvent).where(DeploymentEvent.deployment_id == dep.id)
        )
        await session.execute(delete(Instance).where(Instance.deployment_id == dep.id))
        await session.execute(delete(DeploymentSpec).where(DeploymentSpec.deployment_id == dep.id))
        await session.execute(delete(Deployment).where(Deployment.id == dep.id))
        if version is not None and version.status != VersionStatus.INACTIVE.value:
            live = (
                await session.execute(
                    select(Deployment.id).where(
                        Deployment.version_id == version.id, Deployment.desired == "deployed"
                    )
                )
            ).first()
            if live is None:
                await session.execute(
                    update(FunctionVersion)
                    .where(FunctionVersion.id == version.id)
                    .values(status=VersionStatus.INACTIVE.value, updated_at=now)
                    .execution_options(synchronize_session=False)
                )
        log.info("deployment %s deleted", dep.id)

    async def _trim_history(
        self, session: AsyncSession, deployment_id: uuid.UUID, rows: Mapping[uuid.UUID, Instance]
    ) -> None:
        """Keep only the newest `failed_history` torn-down instances of a deployment."""
        gone = sorted(
            (r for r in rows.values() if r.desired != "present" and not r.applied),
            key=lambda r: (r.updated_at, r.created_at),
            reverse=True,
        )
        stale = [r.id for r in gone[self.config.failed_history :]]
        if stale:
            await session.execute(
                delete(Instance)
                .where(and_(Instance.id.in_(stale)))
                .execution_options(synchronize_session=False)
            )
            for inst_id in stale:
                self._observed_at.pop(inst_id, None)
                self._next_check.pop(inst_id, None)
                self._resync_info.pop(inst_id, None)


def build_reconciler(
    settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    registry: AdapterRegistry,
    catalog: Catalog,
    *,
    secret_box: SecretBox | None = None,
) -> Reconciler:
    """The server's reconciler, configured from settings."""
    return Reconciler(
        sessionmaker,
        registry,
        catalog,
        config=ReconcilerConfig.from_settings(settings),
        secret_box=secret_box,
    )


__all__ = [
    "GarbageCollecting",
    "GarbageReport",
    "PassReport",
    "Reconciler",
    "ReconcilerConfig",
    "build_reconciler",
    "dockerconfig",
    "pull_secret_name",
]
