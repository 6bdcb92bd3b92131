"""GPU intervals (metering/intervals.py) as the reconciler writes them: from each instance's
first Running to its end, once per instance whichever replica writes, and an instance that
never became ready apart."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select, update

from service.deployments.models import Deployment
from service.deployments.reconcile import Reconciler
from service.deployments.reconcile.owner import OwnerId
from service.functions.models import FunctionVersion
from service.metering.models import GpuInterval
from service.metering.usage import Grouping, account_usage
from tests.support.reconcile import ACCOUNT, Harness, workload

ASAP = datetime(2000, 1, 1, tzinfo=UTC)


async def usage(harness: Harness, since: datetime, until: datetime, **kw: Any) -> dict[str, Any]:
    async with harness.maker() as session:
        [group] = await account_usage(
            session,
            ACCOUNT,
            by=Grouping.FUNCTION,
            since=since,
            until=until,
            now=harness.clock.now,
            **kw,
        )
    return group.out()


async def rows(harness: Harness) -> list[GpuInterval]:
    async with harness.maker() as session:
        return list((await session.execute(select(GpuInterval))).scalars())


async def undeploy(harness: Harness, dep: Deployment) -> None:
    async with harness.maker() as session, session.begin():
        await session.execute(
            update(Deployment)
            .where(Deployment.id == dep.id)
            .values(desired="deleting", due_at=ASAP)
        )
        await session.execute(
            update(FunctionVersion)
            .where(FunctionVersion.id == dep.version_id)
            .values(status="INACTIVE")
        )


async def drive(harness: Harness, until: Any, reconcilers: list[Reconciler]) -> None:
    """Passes of each reconciler in turn (replicas of one database), one fake second apart."""
    for _ in range(300):
        for rec in reconcilers:
            assert (await rec.run_once()).errors == 0
        if await until():
            return
        harness.clock.advance(1)
    raise AssertionError("did not converge")


async def test_two_instances_for_a_measured_time_are_instances_times_gpus_times_seconds(
    harness: Harness,
) -> None:
    dep = await harness.deploy([workload(gpus=2)], min_instances=2, instance_type="NCP.GPU.H100_2x")

    async def both_running() -> bool:
        return [i.phase for i in await harness.instances(dep)] == ["Running", "Running"]

    await harness.drive(both_running)
    measured_from = harness.clock.now
    for _ in range(10):  # ten minutes of the fake clock, passes all along
        harness.clock.advance(60)
        assert (await harness.reconciler.run_once()).errors == 0
    measured_to = harness.clock.now
    seconds = (measured_to - measured_from).total_seconds()
    assert seconds == 600

    # open intervals count up to now; the window clips them
    window = await usage(harness, measured_from, measured_to)
    assert abs(window["gpuSeconds"] - 2 * 2 * seconds) <= 0.01 * 2 * 2 * seconds
    assert window["notReadyGpuSeconds"] == 0

    await undeploy(harness, dep)

    async def gone() -> bool:
        return await harness.instances(dep) == []

    await harness.drive(gone)
    stored = await rows(harness)
    assert len(stored) == 2
    assert all(r.started_at is not None and r.ended_at is not None for r in stored)
    assert {r.gpus for r in stored} == {2}
    assert {r.cluster for r in stored} == {"sim-a"}
    # the whole life: each interval from its first Running to its end, counted once
    whole = await usage(harness, measured_from - timedelta(hours=1), harness.clock.now)
    lived = sum(
        (r.ended_at - r.started_at).total_seconds() * r.gpus
        for r in stored
        if r.ended_at is not None and r.started_at is not None
    )
    assert whole["gpuSeconds"] == round(lived, 3)
    assert whole["gpuSeconds"] >= window["gpuSeconds"]
    # later the closed intervals stay as they were
    harness.clock.advance(3600)
    later = await usage(harness, measured_from - timedelta(hours=1), harness.clock.now)
    assert later["gpuSeconds"] == whole["gpuSeconds"]


async def test_an_instance_that_never_became_ready_is_shown_apart(harness: Harness) -> None:
    dep = await harness.deploy([workload(fault="NeverReady")])
    await harness.until_status(dep, "ERROR", step=2.0)
    await undeploy(harness, dep)

    async def gone() -> bool:
        return await harness.instances(dep) == []

    await harness.drive(gone)
    stored = await rows(harness)
    assert stored and all(r.started_at is None and r.ended_at is not None for r in stored)
    got = await usage(harness, stored[0].created_at - timedelta(hours=1), harness.clock.now)
    assert got["gpuSeconds"] == 0
    assert got["notReadyGpuSeconds"] > 0


async def test_a_restart_and_a_second_replica_count_each_instance_once(harness: Harness) -> None:
    first = harness.reconciler
    dep = await harness.deploy([workload()], min_instances=2)

    async def both_running() -> bool:
        return [i.phase for i in await harness.instances(dep)] == ["Running", "Running"]

    await drive(harness, both_running, [first])
    # a restart (a fresh reconciler of the same replica id) and a second replica, alternating
    restarted = harness.new_reconciler(owner=OwnerId(first.owner))
    second = harness.new_reconciler(owner=OwnerId("replica-b"))
    measured_from = harness.clock.now
    for _ in range(5):
        harness.clock.advance(60)
        for rec in (restarted, second):
            assert (await rec.run_once()).errors == 0
    measured_to = harness.clock.now
    window = await usage(harness, measured_from, measured_to)
    assert window["gpuSeconds"] == 2 * 1 * 300

    await undeploy(harness, dep)

    async def gone() -> bool:
        return await harness.instances(dep) == []

    await drive(harness, gone, [second, restarted])
    stored = await rows(harness)
    assert len(stored) == 2  # one interval per instance, each ended once
    assert all(r.ended_at is not None for r in stored)
    whole = await usage(harness, measured_from - timedelta(hours=1), harness.clock.now)
    assert whole["gpuSeconds"] >= window["gpuSeconds"]
