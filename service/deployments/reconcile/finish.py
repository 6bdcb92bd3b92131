"""T3 of a unit of work (unit.py): in one transaction, under the versions' and deployments' row
locks (in that order, as an API change takes them), write what the unit learnt about each
instance (conditions, events, kept log lines, the secrets delivered), end the rollouts a failed
instance stops, aggregate each version's status (counts.py), schedule when each row is due
next, and remove a deployment being deleted whose instances are all gone. Every state change
goes through `service.deployments.transitions`."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession

from service.deployments import repository, rollout, transitions
from service.deployments.logs.keep import keep_logs
from service.deployments.models import Deployment, DeploymentDesired, Instance, InstanceDesired
from service.deployments.reconcile.counts import aggregate
from service.deployments.reconcile.resync import next_resync
from service.deployments.reconcile.work import Claimed, Runtime, Work
from service.functions.models import FunctionVersion
from service.health.machine import Phase

log = logging.getLogger("nvcf.reconciler")


async def finish(rt: Runtime, claimed: list[Claimed]) -> None:
    """T3: write what the unit learnt, aggregate each version's status, schedule every row."""
    now = rt.clock()
    wake = False
    became_running = False
    statuses: list[transitions.StatusChange] = []
    async with rt.sessionmaker() as session, session.begin():
        ids = [c.dep.id for c in claimed]
        versions = await rt.store.lock_versions(session, (c.dep.version_id for c in claimed))
        deps = {
            d.id: d
            for d in await rt.store.lock_deployments(session, ids, skip_locked=False, objects=False)
        }
        rows_by_dep = await rt.store.instances(session, ids)
        for c in claimed:
            dep = deps.get(c.dep.id)
            if dep is None:
                continue
            rows = {r.id: r for r in rows_by_dep.get(dep.id, [])}
            failures, running = await _write_work(rt, session, c.work, rows, now)
            became_running = became_running or running
            version = versions.get(dep.version_id)
            if dep.desired != DeploymentDesired.DEPLOYED or version is None:
                await _finish_delete(rt, session, dep, version, rows, now)
                continue
            failures = await _rollout_failures(session, dep, failures, now)
            settled, again = aggregate(
                session,
                dep,
                version,
                rows,
                failures,
                statuses,
                now,
                owner=rt.owner,
                attempts=rt.config.deploy_attempts,
            )
            wake = wake or again
            stale = await rt.store.trim_history(session, rows.values(), rt.config.failed_history)
            rt.memory.forget(stale)
            if settled:
                await transitions.settle(session, dep)
            else:
                transitions.schedule(dep, now)
        await transitions.set_version_statuses(session, statuses, now)
    if wake:
        rt.wake()
    if became_running and rt.on_running is not None:
        rt.on_running()


async def _write_work(
    rt: Runtime,
    session: AsyncSession,
    work: list[Work],
    rows: dict[uuid.UUID, Instance],
    now: datetime,
) -> tuple[list[Instance], bool]:
    """Store what the unit learnt about its instances; the newly failed ones, and whether one
    became Running."""
    failures: list[Instance] = []
    became_running = False
    for w in work:
        row = rows.get(w.row.id)
        if row is None or row.lease_owner != rt.owner:
            continue  # gone, or the lease was lost meanwhile
        if w.gone:
            await transitions.torn_down(session, row, now)
        if w.secrets_generation is not None and not w.gone:
            transitions.secrets_delivered(session, row, w.secrets_generation, rotated=w.rotated)
        cond = w.condition
        if cond is not None:
            was_wanted = row.desired == InstanceDesired.PRESENT
            if cond.phase is Phase.RUNNING and row.phase != Phase.RUNNING.value:
                became_running = True
            await transitions.observe_instance(session, row, cond, now)
            if w.kept_logs:
                await keep_logs(session, row, w.kept_logs, now)
            if was_wanted and row.desired != InstanceDesired.PRESENT:
                failures.append(row)
        next_check = cond.next_check if cond is not None else None
        running = row.desired == InstanceDesired.PRESENT and row.phase == Phase.RUNNING
        if row.desired == InstanceDesired.PRESENT and row.applied and not running:
            # Starting: looked at again soon after it was applied, then less and less
            # often (a quarter of its age, up to the interval), so an instance that starts
            # fast — a cold start — is seen Running within a fraction of its startup.
            age = (now - row.created_at).total_seconds()
            poll = now + timedelta(seconds=min(rt.config.interval, max(0.05, age / 4)))
            next_check = poll if next_check is None else min(next_check, poll)
        if running and w.target is not None and row.condition is not None:
            rt.memory.resync[row.id] = (w.target, w.mode, row.condition)
        else:
            rt.memory.resync.pop(row.id, None)
        if running and w.restarts is not None:
            rt.memory.restarts[row.id] = w.restarts
        elif not running:
            rt.memory.restarts.pop(row.id, None)
        if next_check is not None:
            rt.memory.next_check[row.id] = next_check
        else:
            rt.memory.next_check.pop(row.id, None)
        if running:
            due: datetime | None = next_resync(row.id, now, rt.config.resync_seconds)
            if next_check is not None and due is not None and next_check < due:
                due = next_check
        elif row.desired == InstanceDesired.PRESENT or row.applied:
            due = now  # starting, or being torn down: looked at on every pass
        else:
            due = None
        transitions.schedule_instance(row, due)
    return failures, became_running


async def _rollout_failures(
    session: AsyncSession,
    dep: Deployment,
    failures: list[Instance],
    now: datetime,
) -> list[Instance]:
    """A failed instance of a spec's rollout target ends that rollout (the serving
    revision stays); the other failures, which the version status judges."""
    others: list[Instance] = []
    for row in failures:
        spec = next((s for s in dep.specs if s.id == row.spec_id), None)
        if (
            spec is None
            or spec.rollout_state != rollout.RolloutState.PROGRESSING
            or row.revision != spec.target_revision
            or spec.target_revision == spec.revision
        ):
            others.append(row)
            continue
        serving = await repository.spec_revision(session, spec.id, spec.revision)
        if serving is None:  # cannot happen: revisions live as long as their spec
            others.append(row)
            continue
        await transitions.rollout_failed(
            session,
            dep,
            spec,
            serving,
            now,
            reason=f"instance {row.id} failed: {row.reason}: {row.message}",
        )
    return others


async def _finish_delete(
    rt: Runtime,
    session: AsyncSession,
    dep: Deployment,
    version: FunctionVersion | None,
    rows: dict[uuid.UUID, Instance],
    now: datetime,
) -> None:
    """Undeploy / version delete: once every instance is gone, remove the records (its
    timeline and failed instances stay as history)."""
    for row in rows.values():
        if row.desired == InstanceDesired.PRESENT:
            transitions.unwant(row)
    if any(r.applied for r in rows.values()):
        transitions.schedule(dep, now)  # some instance still exists on a backend
        return
    retention = timedelta(seconds=rt.config.history_retention)
    await transitions.remove_deployment(session, dep, version, now, retention=retention)
    rt.memory.forget(list(rows))
    log.info("deployment %s deleted", dep.id)
