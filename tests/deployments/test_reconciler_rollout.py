"""Rollouts and drains in the reconciler, against the real databases and a simulated cluster on
a fake clock: a spec whose target revision changes rolls one instance at a time and is never
without a Running instance; a target revision whose instance fails leaves the serving revision;
a retired instance with requests in flight stays until idle or until the drain timeout."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import update

from service.deployments.models import ASAP, Deployment, DeploymentSpec, Instance, SpecRevision
from tests.support.reconcile import Harness, workload


class Requests:
    """A stand-in for the invocation plane's view (reconcile/drain.py `Activity`)."""

    def __init__(self) -> None:
        self.in_flight: dict[uuid.UUID, int] = {}

    async def requests_in_flight(self, instance_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int]:
        return {i: self.in_flight[i] for i in instance_ids if self.in_flight.get(i)}

    async def requests_waiting(self, version_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int]:
        return {}


async def roll_to(harness: Harness, dep: Deployment, number: int, objects: list[Any]) -> None:
    """What a configuration PATCH stores: revision `number` as the spec's target, rolling."""
    async with harness.maker() as session, session.begin():
        row = await session.get(Deployment, dep.id)
        assert row is not None
        [spec] = row.specs
        for n, objs in ((1, spec.objects), (number, objects)):
            if await session.get(SpecRevision, (spec.id, n)) is None:
                session.add(SpecRevision(spec_id=spec.id, number=n, objects=objs))
        spec.target_revision = number
        spec.objects = objects
        spec.rollout_state = "progressing"
        await session.execute(update(Deployment).where(Deployment.id == dep.id).values(due_at=ASAP))


async def spec_of(harness: Harness, dep: Deployment) -> DeploymentSpec:
    async with harness.maker() as session:
        deployment = await session.get(Deployment, dep.id)
        assert deployment is not None
        return deployment.specs[0]


async def test_rollout_replaces_instances_one_at_a_time_never_without_a_running_one(
    harness: Harness,
) -> None:
    dep = await harness.deploy([workload()], min_instances=2)
    await harness.until_status(dep, "ACTIVE")
    old = {i.id for i in await harness.instances(dep, present_only=True)}
    await roll_to(harness, dep, 2, [workload("echo-v2")])

    most_wanted = 0

    async def completed() -> bool:
        nonlocal most_wanted
        present = await harness.instances(dep, present_only=True)
        running = [i for i in present if i.phase == "Running"]
        assert len(running) >= 2, present  # never fewer Running than minInstances
        most_wanted = max(most_wanted, len(present))
        spec = await spec_of(harness, dep)
        return spec.revision == 2 and spec.rollout_state == "completed"

    await harness.drive(completed)
    present = await harness.instances(dep, present_only=True)
    assert [(i.revision, i.phase) for i in present] == [(2, "Running"), (2, "Running")]
    assert not old & {i.id for i in present}
    assert most_wanted <= 3  # a surge of one at most
    assert await harness.status(dep) == "ACTIVE"
    reasons = [e.reason for e in await harness.events(dep, "rollout")]
    assert reasons.count("Replaced") == 2 and reasons[-1] == "RolloutCompleted"


async def test_a_failing_target_revision_leaves_the_serving_revision(harness: Harness) -> None:
    dep = await harness.deploy([workload()])
    await harness.until_status(dep, "ACTIVE")
    [serving] = await harness.instances(dep, present_only=True)
    await roll_to(harness, dep, 2, [workload(fault="ImagePullBackOff")])

    async def failed() -> bool:
        return (await spec_of(harness, dep)).rollout_state == "failed"

    await harness.drive(failed)
    spec = await spec_of(harness, dep)
    assert (spec.revision, spec.target_revision) == (1, 1)
    assert spec.rollout_reason is not None and "revision 2" in spec.rollout_reason
    assert "ImagePull" in spec.rollout_reason
    assert spec.objects == [workload()]
    [still] = await harness.instances(dep, present_only=True)
    assert (still.id, still.phase, still.revision) == (serving.id, "Running", 1)
    assert await harness.status(dep) == "ACTIVE"
    # settles: nothing more is created for the failed revision
    for _ in range(5):
        await harness.reconciler.run_once()
        harness.clock.advance(1)
    assert [i.id for i in await harness.instances(dep, present_only=True)] == [serving.id]


async def test_scale_down_drains_a_busy_instance_until_it_is_idle(harness: Harness) -> None:
    requests = Requests()
    harness.reconciler.activity = requests
    dep = await harness.deploy([workload()], min_instances=2)
    await harness.until_status(dep, "ACTIVE")
    for inst in await harness.instances(dep):
        requests.in_flight[inst.id] = 1
    await scale(harness, dep, 1)

    async def retired() -> list[Instance]:
        return [i for i in await harness.instances(dep) if i.desired == "absent"]

    await harness.drive(retired)
    [gone] = await retired()
    for _ in range(5):  # 50 s of a 300 s drain timeout: it keeps its request
        await harness.reconciler.run_once()
        harness.clock.advance(10)
    [gone] = await retired()
    assert gone.applied and gone.drain_since is not None
    [event] = [e for e in await harness.events(dep, "scaling") if e.instance_id == gone.id]
    assert "draining" in event.message

    requests.in_flight.clear()

    async def torn_down() -> bool:
        return not any(i.applied for i in await retired())

    await harness.drive(torn_down)


async def test_a_drain_ends_at_the_drain_timeout(harness: Harness) -> None:
    requests = Requests()
    harness.reconciler = harness.new_reconciler(drain_timeout=30)
    harness.reconciler.activity = requests
    dep = await harness.deploy([workload()], min_instances=2)
    await harness.until_status(dep, "ACTIVE")
    for inst in await harness.instances(dep):
        requests.in_flight[inst.id] = 1
    await scale(harness, dep, 1)

    async def torn_down() -> Instance | None:
        gone = [i for i in await harness.instances(dep) if i.desired == "absent"]
        return gone[0] if gone and not gone[0].applied else None

    await harness.drive(torn_down, step=5)
    gone = await torn_down()
    assert gone is not None and gone.drain_since is not None
    assert harness.clock() - gone.drain_since >= timedelta(seconds=30)


async def scale(harness: Harness, dep: Deployment, to: int) -> None:
    async with harness.maker() as session, session.begin():
        await session.execute(
            update(DeploymentSpec)
            .where(DeploymentSpec.deployment_id == dep.id)
            .values(min_instances=to)
        )
        await session.execute(update(Deployment).where(Deployment.id == dep.id).values(due_at=ASAP))
