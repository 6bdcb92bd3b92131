"""One unit of work over a batch of deployments: claim → place/apply/observe/teardown → finish.

T1 (one short transaction) locks the deployments (`FOR UPDATE SKIP LOCKED` on PostgreSQL),
leases their instances, creates the missing Instance rows (committed before anything is
applied) and retires surplus ones (counts.py). Then, outside any transaction, new instances
are placed (placement.py), the placement is recorded (T2) and the install-time-mutated objects
applied; every leased instance is observed, evaluated (service.health) and torn down when
failed or unwanted, and an applied instance whose Secret holds an older generation of the
version's secrets gets the current one in place (`update_objects`: no restart). T3
(finish.py) writes conditions and events, aggregates each version's status (counts.py) and
schedules when each row is due next; a deployment being deleted whose instances are all gone is
removed. What the unit holds is work.py. Every state change goes through
`service.deployments.transitions`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from service.backends.kubernetes.adapter import adds_collector
from service.backends.protocol import AdapterError, BackendAdapter, InstanceSpec
from service.clusters.instance_types import InstanceTypeError, parse_instance_type
from service.deployments import repository, rollout, transitions
from service.deployments.logs.keep import (
    ContainerKey,
    last_lines,
    restart_counts,
    restarted,
)
from service.deployments.logs.mask import Masker
from service.deployments.models import (
    Deployment,
    DeploymentDesired,
    DeploymentSpec,
    Instance,
    InstanceDesired,
)
from service.deployments.reconcile.converge import converge_counts
from service.deployments.reconcile.counts import secrets_stale
from service.deployments.reconcile.drain import Loads, drain_since, read_loads
from service.deployments.reconcile.finish import finish
from service.deployments.reconcile.placement import (
    CapacityView,
    permitted_candidates,
    place,
)
from service.deployments.reconcile.targets import (
    VersionSecrets,
    health_mode,
    install_objects,
    instance_spec,
    secrets_objects,
)
from service.deployments.reconcile.work import Claimed, Runtime, Work
from service.health.conditions import backend_error, failed, previous_condition
from service.health.machine import HealthMode, InstanceCondition, Phase, evaluate
from service.health.observed import ObservedState
from service.health.status import VersionStatus
from service.observability.collector import sidecar_for, workload_attributes
from service.registry.pull_secrets import PullSecrets, account_pull_secrets

log = logging.getLogger("nvcf.reconciler")


class UnitOfWork:
    """Converge a batch of deployments once (see the module docstring)."""

    def __init__(self, rt: Runtime, deployment_ids: Sequence[uuid.UUID], view: CapacityView):
        self.rt = rt
        self.ids = sorted(deployment_ids)
        self.view = view
        self._secrets: dict[str, PullSecrets] = {}
        self._version_secrets = VersionSecrets(rt.sessionmaker, rt.secret_box)
        self._revisions: dict[tuple[uuid.UUID, int], list[Any]] = {}
        self._loads = Loads()

    async def run(self) -> None:
        claimed = await self._claim()
        if not claimed:
            return
        fresh = await self._place(claimed)
        await self._version_secrets.prefetch(
            [
                c.dep.version_id
                for c in claimed
                if not c.tearing_down
                and any(w.row.id in fresh or secrets_stale(w.row, c.version) for w in c.work)
            ]
        )
        self._loads = await self._drain_loads(claimed)
        for c in claimed:
            await self._drive(c, fresh)
            # An in-process backend (the simulated cluster) answers without yielding: let the
            # API's requests in between deployments, not only between units.
            await asyncio.sleep(0)
        await finish(self.rt, claimed)
        if self.rt.on_draining is not None:
            for c in claimed:
                if any(w.row.drain_since is not None for w in c.work):
                    self.rt.on_draining(c.dep.version_id)

    # ---------------------------------------------------------------- T1

    async def _claim(self) -> list[Claimed]:
        rt = self.rt
        now = rt.clock()
        expires = now + timedelta(seconds=rt.config.lease_seconds)
        out: list[Claimed] = []
        async with rt.sessionmaker() as session, session.begin():
            deps = await rt.store.lock_deployments(session, self.ids, skip_locked=True)
            if not deps:
                return []  # gone, or another replica holds them right now
            versions = await rt.store.versions(session, deps)
            await rt.store.claim(session, [d.id for d in deps], now)
            rows = await rt.store.instances(session, [d.id for d in deps])
            for dep in deps:
                version = versions.get(dep.version_id)
                mine = rows.get(dep.id, [])
                if (
                    dep.desired == DeploymentDesired.DEPLOYED
                    and version is not None
                    and version.status != VersionStatus.ERROR
                ):
                    mine = mine + await converge_counts(
                        session,
                        dep,
                        mine,
                        now,
                        owner=rt.owner,
                        expires=expires,
                        status=transitions.status_of(version),
                        attempts=rt.config.deploy_attempts,
                    )
                specs = {s.id: s for s in dep.specs}
                work = [
                    Work(row=r, spec=specs[r.spec_id])
                    for r in mine
                    if r.lease_owner == rt.owner and r.spec_id in specs
                ]
                out.append(Claimed(dep, version, work))
        return out

    # ---------------------------------------------------------------- placement (T2)

    async def _place(self, claimed: list[Claimed]) -> set[uuid.UUID]:
        """Place every new instance (preferred specs first) and record the placements; the
        ids of the instances to apply now."""
        placed: list[Work] = []
        for c in claimed:
            if c.tearing_down:
                continue
            waiting = [
                w
                for w in c.work
                if w.row.desired == InstanceDesired.PRESENT and w.row.cluster is None
            ]
            waiting.sort(key=lambda w: (w.spec.preferred_order, w.spec.position, w.row.created_at))
            for w in waiting:
                await self._place_one(w)
                await asyncio.sleep(0)
                if w.placed_on is not None:
                    placed.append(w)
        if not placed:
            return set()
        async with self.rt.sessionmaker() as session, session.begin():
            done = await transitions.place_instances(
                session,
                [(w.row, w.placed_on) for w in placed if w.placed_on is not None],
                self.rt.owner,
                self.rt.clock(),
            )
        return {row.id for row in done}

    async def _place_one(self, w: Work) -> None:
        now = self.rt.clock()
        try:
            it = parse_instance_type(w.spec.instance_type)
        except InstanceTypeError as exc:
            w.condition = failed("InvalidInstanceType", str(exc), now, None)
            return
        candidates = [str(c) for c in w.spec.candidate_clusters or []]
        permitted = permitted_candidates(self.rt.catalog, candidates, w.spec.helm_validation_policy)
        if candidates and not permitted:
            w.condition = failed(
                "PolicyNotPermitted",
                f"helmValidationPolicy {w.spec.helm_validation_policy!r} is permitted by none "
                f"of the candidate clusters ({', '.join(candidates)}) any more",
                now,
                previous_condition(w.row.condition),
            )
            return
        placement = await place(
            self.view,
            permitted,
            gpu=it.gpu,
            gpus_per_node=it.gpus_per_node,
            nodes=it.nodes,
        )
        if placement.cluster is not None:
            w.placed_on = placement.cluster
        elif placement.unavailable:
            w.condition = failed(
                "ClusterUnavailable", placement.message, now, previous_condition(w.row.condition)
            )
        else:
            w.placement_event = placement.message

    # ---------------------------------------------------------------- backend calls

    async def _pull_secrets(self, account_id: str) -> PullSecrets:
        """The account's pull secrets, read at most once per unit of work."""
        if self.rt.secret_box is None:
            return []
        if account_id not in self._secrets:
            async with self.rt.sessionmaker() as session:
                self._secrets[account_id] = await account_pull_secrets(
                    session, account_id, self.rt.secret_box
                )
        return self._secrets[account_id]

    async def _drive(self, c: Claimed, fresh: set[uuid.UUID]) -> None:
        mode = health_mode(c.dep)
        for w in c.work:
            row = w.row
            if c.tearing_down or row.desired != InstanceDesired.PRESENT:
                if row.applied and self._drained(c, row):
                    w.gone = await self._teardown(c, w)
                continue
            if w.condition is not None:  # decided during placement (unavailable cluster)
                continue
            if row.cluster is None:
                message = w.placement_event or "waiting for a cluster with free capacity"
                w.condition = self._evaluate(ObservedState.unplaced(message), row, mode)
                w.observed = True
                continue
            adapter = self.rt.registry.get(row.cluster)
            if adapter is None:
                why = self.rt.registry.unavailable_reason(row.cluster) or row.cluster
                w.condition = failed(
                    "ClusterUnavailable", why, self.rt.clock(), previous_condition(row.condition)
                )
            else:
                w.condition = await self._observe(adapter, c, w, mode, fresh=row.id in fresh)
                w.observed = True
            if w.condition.phase is Phase.FAILED and row.applied:
                if adapter is not None and w.target is not None:
                    w.kept_logs = await self._last_lines(adapter, c, w.target)
                w.gone = await self._teardown(c, w)
            elif adapter is not None and w.target is not None and w.restarts is not None:
                again = restarted(self.rt.memory.restarts.get(row.id), w.restarts)
                if again and row.phase == Phase.RUNNING.value:
                    w.kept_logs = await self._last_lines(adapter, c, w.target, only=again)

    async def _observe(
        self, adapter: BackendAdapter, c: Claimed, w: Work, mode: HealthMode, *, fresh: bool
    ) -> InstanceCondition:
        """Apply (new instance, or one the backend forgot), observe, evaluate."""
        row, spec = w.row, w.spec
        target = instance_spec(c.dep, c.version, row, spec)
        w.target, w.mode = target, mode
        try:
            if fresh:
                await adapter.apply(await self._telemetry(c, target), await self._objects(c.dep, w))
            observed = await adapter.observe(target)
            if observed.is_empty and row.applied and not fresh:
                log.info(
                    "instance %s is unknown to cluster %s: applying again", row.id, row.cluster
                )
                await adapter.apply(await self._telemetry(c, target), await self._objects(c.dep, w))
                observed = await adapter.observe(target)
            elif not fresh and secrets_stale(row, c.version):
                await self._rotate_secrets(adapter, c, w, target)
            w.restarts = restart_counts(observed)
        except AdapterError as exc:
            return backend_error(
                f"cluster {row.cluster}: {exc.message}",
                retryable=exc.retryable,
                previous=previous_condition(row.condition),
                phase=_phase(row.phase),
                now=self.rt.clock(),
                failing_backoff=self.rt.config.timeouts.failing_backoff,
            )
        return self._evaluate(observed, row, mode)

    async def _last_lines(
        self,
        adapter: BackendAdapter,
        c: Claimed,
        target: InstanceSpec,
        only: frozenset[ContainerKey] | None = None,
    ) -> list[dict[str, Any]]:
        _, secrets = await self._version_secrets.get(c.dep.version_id)
        config = self.rt.config
        return await last_lines(
            adapter,
            target,
            Masker(secrets.values()),
            lines=config.kept_lines,
            max_bytes=config.kept_bytes,
            only=only,
        )

    async def _telemetry(self, c: Claimed, target: InstanceSpec) -> InstanceSpec:
        """`target` with the collector of the telemetries its version names (if any)."""
        if c.version is None or not c.version.telemetries:
            return target
        attributes = workload_attributes(
            c.dep.account_id,
            target.instance_id,
            function_id=target.function_id,
            version_id=target.version_id,
        )
        async with self.rt.sessionmaker() as session:
            sidecar = await sidecar_for(
                session, self.rt.secret_box, c.dep.account_id, c.version.telemetries, attributes
            )
        return dataclasses.replace(target, telemetry=sidecar)

    async def _objects(self, dep: Deployment, w: Work) -> list[dict[str, Any]]:
        """The instance's install objects, its Secret with the version's current secrets."""
        pull = await self._pull_secrets(dep.account_id)
        generation, secrets = await self._version_secrets.get(dep.version_id)
        w.secrets_generation = generation
        objects = await self._revision_objects(w.spec, w.row.revision)
        return install_objects(self.rt.catalog, dep, w.row, w.spec, pull, secrets, objects=objects)

    async def _rotate_secrets(
        self, adapter: BackendAdapter, c: Claimed, w: Work, target: InstanceSpec
    ) -> None:
        """Write the version's updated secrets into the instance's Secret, in place (no
        restart). On a cluster adding the collector, a version naming telemetries has its
        objects applied again with the collector of the telemetries' current keys: its Secret
        is replaced, and the keys' checksum on the pod template (backends/collector_pod.py)
        rolls the pods whose collector holds an older key. A failure is retried on a later
        pass: the deployment stays due until every instance has them."""
        objects = await self._objects(c.dep, w)
        if c.version is not None and c.version.telemetries and adds_collector(adapter):
            target = await self._telemetry(c, target)
        else:
            objects = secrets_objects(objects)
        try:
            await adapter.update_objects(target, objects)
        except AdapterError as exc:
            w.secrets_generation = None
            log.warning(
                "updating the secrets of instance %s on %s failed: %s",
                w.row.id,
                w.row.cluster,
                exc.message,
            )
            return
        w.rotated = True

    async def _revision_objects(self, spec: DeploymentSpec, number: int) -> list[Any] | None:
        """The validated objects of an instance's revision when it is not the spec's target
        (an old instance re-applied during a rollout); None: the spec's own."""
        if number == spec.target_revision:
            return None
        key = (spec.id, number)
        if key not in self._revisions:
            async with self.rt.sessionmaker() as session:
                found = await repository.spec_revision(session, spec.id, number)
            self._revisions[key] = list(found.objects) if found is not None else []
        return self._revisions[key] or None

    # ---------------------------------------------------------------- drain

    def _drain_since(self, c: Claimed, row: Instance) -> datetime | None:
        return drain_since(c.dep, row, tearing_down=c.tearing_down)

    async def _drain_loads(self, claimed: list[Claimed]) -> Loads:
        """Requests in flight on the draining instances (and waiting for their versions, for a
        graceful undeploy), asked of the invocation plane once per unit."""
        instances: list[uuid.UUID] = []
        versions: set[uuid.UUID] = set()
        for c in claimed:
            for w in c.work:
                row = w.row
                gone = c.tearing_down or row.desired != InstanceDesired.PRESENT
                if gone and row.applied and self._drain_since(c, row) is not None:
                    instances.append(row.id)
                    if c.tearing_down:
                        versions.add(c.dep.version_id)
        return await read_loads(self.rt.activity, instances, sorted(versions))

    def _drained(self, c: Claimed, row: Instance) -> bool:
        since = self._drain_since(c, row)
        if since is None:
            return True
        loads = self._loads
        return rollout.drained(
            since=since,
            now=self.rt.clock(),
            timeout=self.rt.config.drain_timeout,
            grace=self.rt.config.drain_grace,
            in_flight=loads.in_flight.get(row.id, 0) if loads.known else None,
            waiting=loads.waiting.get(c.dep.version_id, 0) if c.tearing_down else 0,
        )

    def _evaluate(
        self, observed: ObservedState, row: Instance, mode: HealthMode
    ) -> InstanceCondition:
        return evaluate(
            observed,
            previous_condition(row.condition),
            self.rt.clock(),
            self.rt.config.timeouts,
            mode,
        )

    async def _teardown(self, c: Claimed, w: Work) -> bool:
        """Delete the instance's objects; True once the backend reports them gone."""
        row = w.row
        if row.cluster is None:
            return True
        adapter = self.rt.registry.get(row.cluster)
        if adapter is None:
            log.warning(
                "instance %s: %s; treating it as gone",
                row.id,
                self.rt.registry.unavailable_reason(row.cluster),
            )
            return True
        try:
            return await adapter.delete(instance_spec(c.dep, None, row, w.spec))
        except AdapterError as exc:
            log.warning("deleting instance %s on %s failed: %s", row.id, row.cluster, exc.message)
            return False


def _phase(value: str) -> Phase:
    try:
        return Phase(value)
    except ValueError:
        return Phase.SCHEDULING
