"""Observation by change (issue 32), on the simulated cluster with a fake clock: a settled fleet
is not observed until its cluster reports a change (a fault annotation, a step of a pod's
timeline) or the safety-net period passes; a change makes exactly that instance due; a feed that
may have missed changes (a re-established watch) and a new reconciler re-observe everything
once; resync slots are spread over the period."""

from __future__ import annotations

import random
import uuid
from collections import Counter
from datetime import datetime, timedelta

import pytest
from sqlalchemy import update

from service.backends.changes import Changes
from service.backends.protocol import AdapterError, InstanceSpec
from service.deployments.models import Deployment, Instance
from service.deployments.reconcile import Reconciler
from service.deployments.reconcile.resync import SLOTS, next_resync
from service.health.observed import ObservedState
from tests.support.reconcile import T0, Harness, workload

PERIOD = 3600.0


def count_observations(harness: Harness) -> list[str]:
    """The instance ids the simulated cluster `sim-a` is asked to observe, in order."""
    calls: list[str] = []
    sim = harness.sim()
    original = sim.observe

    async def observe(instance: InstanceSpec) -> ObservedState:
        calls.append(instance.instance_id)
        return await original(instance)

    sim.observe = observe  # type: ignore[method-assign]
    return calls


async def settled_fleet(harness: Harness, rec: Reconciler, size: int) -> list[Deployment]:
    deps = [await harness.deploy([workload()]) for _ in range(size)]
    for dep in deps:
        await harness.until_status(dep, "ACTIVE", reconciler=rec)
    for _ in range(3):  # the last starting-instance polls
        harness.clock.advance(2)
        await rec.run_once()
    return deps


async def instance_id(harness: Harness, dep: Deployment) -> str:
    (inst,) = await harness.instances(dep, present_only=True)
    return str(inst.id)


async def test_settled_fleet_is_not_observed_until_something_changes(harness: Harness) -> None:
    rec = harness.new_reconciler(resync_seconds=PERIOD)
    calls = count_observations(harness)
    deps = await settled_fleet(harness, rec, 3)
    calls.clear()
    for _ in range(25):  # 25 minutes of passes, a minute apart
        harness.clock.advance(60)
        report = await rec.run_once()
        assert report.reconciled == 0 and report.resynced == 0
    assert calls == []

    # a fault annotation flipping on one instance: exactly that one is observed, at once
    target = await instance_id(harness, deps[1])
    assert await harness.sim().annotate_pods(target, {"sim.nvcf.io/fault": "NeverReady"}) == 1
    await rec.run_once()
    assert calls == [target]
    inst = next(i for i in await harness.instances(deps[1]) if str(i.id) == target)
    assert inst.condition is not None and inst.condition["reason"] != "Running"
    for dep in (deps[0], deps[2]):
        (other,) = await harness.instances(dep, present_only=True)
        assert other.condition is not None and other.condition["phase"] == "Running"


async def test_the_safety_net_observes_each_settled_instance_once_per_period(
    harness: Harness,
) -> None:
    rec = harness.new_reconciler(resync_seconds=PERIOD)
    calls = count_observations(harness)
    deps = await settled_fleet(harness, rec, 4)
    ids = {await instance_id(harness, dep) for dep in deps}
    calls.clear()
    for _ in range(int(1.5 * PERIOD / 60)):  # one and a half periods, a minute apart
        harness.clock.advance(60)
        await rec.run_once()
    seen = Counter(calls)
    assert set(seen) == ids
    assert all(1 <= n <= 2 for n in seen.values())
    for dep in deps:
        assert await harness.status(dep) == "ACTIVE"


async def test_a_resync_after_the_lease_ran_out_is_a_re_observation_not_a_unit(
    harness: Harness,
) -> None:
    """The safety net comes long after a settled instance's lease (60 s) has run out: while
    nobody else claimed it, the reconciler that held it last re-observes it on its own (no
    unit of work re-reading the deployment) and renews the lease; one another replica took
    meanwhile goes through a unit of work that claims it back."""
    rec = harness.new_reconciler(resync_seconds=PERIOD)
    calls = count_observations(harness)
    deps = await settled_fleet(harness, rec, 3)
    ids = {await instance_id(harness, dep) for dep in deps}
    taken = deps[2]
    async with harness.maker() as session, session.begin():
        await session.execute(
            update(Instance)
            .where(Instance.deployment_id == taken.id)
            .values(lease_owner="another-replica", lease_expires_at=T0)  # long expired
        )
    calls.clear()
    settled_at = harness.clock()
    resynced = reconciled = 0
    for _ in range(int(1.5 * PERIOD / 60)):  # each one's slot is due within 1.5 periods
        harness.clock.advance(60)
        report = await rec.run_once()
        resynced, reconciled = resynced + report.resynced, reconciled + report.reconciled
        if set(calls) == ids:
            break
    assert set(calls) == ids
    assert (resynced, reconciled) == (2, 1)  # deployments: two re-observed, the taken one
    for dep in deps:
        (inst,) = await harness.instances(dep, present_only=True)
        assert inst.lease_owner == rec.owner
        # renewed (60 s) at its re-observation, a minute or more after the fleet settled
        renewed = settled_at + timedelta(seconds=120)
        assert inst.lease_expires_at is not None and inst.lease_expires_at >= renewed
        assert inst.condition is not None and inst.condition["phase"] == "Running"
        assert await harness.status(dep) == "ACTIVE"


async def test_a_timeline_step_is_observed_without_a_periodic_pass(harness: Harness) -> None:
    """FailAfterReady: the pod stops being ready 120 s after it became ready, a step of the
    simulated timeline, noticed although the safety net is an hour away."""
    rec = harness.new_reconciler(resync_seconds=PERIOD)
    calls = count_observations(harness)
    notes = {"sim.nvcf.io/fail-after": "120s"}
    dep = await harness.deploy([workload(fault="FailAfterReady", annotations=notes)])
    await harness.until_status(dep, "ACTIVE", reconciler=rec)
    for _ in range(3):
        harness.clock.advance(2)
        await rec.run_once()
    target = await instance_id(harness, dep)
    calls.clear()
    harness.clock.advance(30)
    await rec.run_once()
    assert calls == []  # nothing changed yet
    harness.clock.advance(120)
    await rec.run_once()
    assert calls == [target]
    inst = next(i for i in await harness.instances(dep) if str(i.id) == target)
    assert inst.condition is not None and inst.condition["reason"] != "Running"


async def test_a_re_established_watch_re_observes_its_cluster_once(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A feed that may have missed changes (a Kubernetes watch lost and re-established; the
    simulated cluster reports it here once) makes every instance of its cluster due once."""
    rec = harness.new_reconciler(resync_seconds=PERIOD)
    calls = count_observations(harness)
    deps = await settled_fleet(harness, rec, 3)
    ids = {await instance_id(harness, dep) for dep in deps}
    sim = harness.sim()
    original = sim.take_changes
    lost = [True]

    def take_changes(now: datetime) -> Changes:
        changes = original(now)
        if lost:
            lost.clear()
            changes.resync = True
        return changes

    monkeypatch.setattr(sim, "take_changes", take_changes)
    calls.clear()
    harness.clock.advance(60)
    await rec.run_once()
    assert sorted(calls) == sorted(ids)
    calls.clear()
    for _ in range(5):
        harness.clock.advance(60)
        await rec.run_once()
    assert calls == []
    for dep in deps:
        assert await harness.status(dep) == "ACTIVE"


async def test_a_new_reconciler_observes_every_instance_once(harness: Harness) -> None:
    rec = harness.new_reconciler(resync_seconds=PERIOD)
    deps = await settled_fleet(harness, rec, 3)
    ids = {await instance_id(harness, dep) for dep in deps}
    calls = count_observations(harness)
    restarted = harness.new_reconciler(resync_seconds=PERIOD)
    harness.clock.advance(61)  # the first one's leases expired
    await restarted.run_once()
    assert sorted(calls) == sorted(ids)
    calls.clear()
    for _ in range(5):
        harness.clock.advance(60)
        await restarted.run_once()
    assert calls == []


async def test_annotating_an_unknown_fault_is_refused(harness: Harness) -> None:
    rec = harness.new_reconciler(resync_seconds=PERIOD)
    (dep,) = await settled_fleet(harness, rec, 1)
    target = await instance_id(harness, dep)
    try:
        await harness.sim().annotate_pods(target, {"sim.nvcf.io/fault": "Sleepy"})
    except AdapterError as exc:
        assert "unknown sim.nvcf.io/fault 'Sleepy'" in exc.message
        assert not exc.retryable
    else:
        raise AssertionError("an unknown fault was accepted")
    assert await harness.sim().annotate_pods(str(uuid.uuid4()), {"a": "b"}) == 0


def test_resync_slots_are_spread_evenly_over_the_period() -> None:
    rng = random.Random(32)  # a fixed sample of random ids: the spread checked is repeatable
    ids = [uuid.UUID(int=rng.getrandbits(128), version=4) for _ in range(SLOTS * 50)]
    due = [next_resync(i, T0, PERIOD) for i in ids]
    assert all(
        timedelta(seconds=PERIOD / 2) <= d - T0 < timedelta(seconds=1.5 * PERIOD) for d in due
    )
    per_slot = Counter(int((d - T0).total_seconds() // (PERIOD / SLOTS)) % SLOTS for d in due)
    assert len(per_slot) == SLOTS
    assert max(per_slot.values()) < 3 * min(per_slot.values())
    # a slot is the instance's own: observed again later, it keeps its place in the period
    again = [next_resync(i, d, PERIOD) for i, d in zip(ids, due, strict=True)]
    assert all(a - d == timedelta(seconds=PERIOD) for a, d in zip(again, due, strict=True))
    assert next_resync(ids[0], T0, 0) == T0
