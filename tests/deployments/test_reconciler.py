"""Reconciler against the real databases (SQLite and PostgreSQL) and simulated clusters on a fake
clock: convergence, every fault annotation's phase/reason/status, replacement, scaling,
teardown, adapter errors, unavailable clusters and the idle fast path."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, update

from service.backends.logs import LogLine, LogRequest
from service.backends.protocol import (
    AdapterError,
    BackendAdapter,
    Capacity,
    InstanceSpec,
)
from service.backends.simulated.adapter import SimulatedAdapter
from service.backends.worker import WorkerEndpoint, WorkerPort
from service.clusters.adapters import AdapterRegistry
from service.clusters.catalog import Catalog
from service.deployments.models import (
    ASAP,
    Deployment,
    DeploymentHistory,
    DeploymentSpec,
    Instance,
)
from service.functions.models import FunctionVersion
from service.health.observed import ObservedState
from tests.support.reconcile import (
    ACCOUNT,
    TIMEOUTS,
    Harness,
    catalog_data,
    namespaces,
    service,
    workload,
)

# ------------------------------------------------------------------------------- convergence


async def test_deploying_to_active_with_events(harness: Harness) -> None:
    dep = await harness.deploy([workload()])
    await harness.until_status(dep, "ACTIVE")
    [inst] = await harness.instances(dep)
    assert (inst.phase, inst.desired, inst.cluster, inst.applied) == (
        "Running",
        "present",
        "sim-a",
        True,
    )
    assert inst.condition is not None and inst.condition["phase"] == "Running"
    objects = await harness.sim().objects(
        InstanceSpec(str(inst.id), "f", "v", "NCP.GPU.H100_1x", "H100", 1)
    )
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    labels = deployment["metadata"]["labels"]
    assert labels["nvcf.nvidia.com/instance-id"] == str(inst.id)
    assert labels["nvcf.nvidia.com/nca-id"] == ACCOUNT
    events = await harness.events(dep)
    reasons = [(e.kind, e.reason) for e in events]
    assert ("instance", "Created") in reasons and ("instance", "Placed") in reasons
    phases = [e.phase for e in events if e.kind == "instance" and e.reason not in (None,)]
    assert phases[-1] == "Running"
    status_events = [e.message for e in events if e.kind == "status"]
    assert status_events == ["function version status DEPLOYING → ACTIVE"]


async def test_idle_active_deployment_is_not_observed_until_resync(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    inner = harness.sim()

    class Counting(SimulatedAdapter):
        pass

    original = inner.observe

    async def counting_observe(instance: InstanceSpec) -> ObservedState:
        calls.append(instance.instance_id)
        return await original(instance)

    monkeypatch.setattr(inner, "observe", counting_observe)
    rec = harness.new_reconciler(resync_seconds=60)
    dep = await harness.deploy([workload()])
    await harness.until_status(dep, "ACTIVE", reconciler=rec)
    calls.clear()
    for _ in range(5):
        report = await rec.run_once()
        # nothing is due: the pass does not even read the deployment
        assert report.reconciled == 0 and report.deployments == 0
        harness.clock.advance(1)
    assert calls == []
    harness.clock.advance(90)  # the instance's resync slot: half to one and a half periods
    report = await rec.run_once()
    # one observation, without a unit of work: its lease ran out, but nobody else took it
    assert (report.resynced, report.reconciled, len(calls)) == (1, 0, 1)
    assert await harness.status(dep) == "ACTIVE"


async def test_min_zero_stays_active_without_instances(harness: Harness) -> None:
    dep = await harness.deploy([workload()], min_instances=0, status="ACTIVE")
    for _ in range(3):
        await harness.reconciler.run_once()
    assert await harness.status(dep) == "ACTIVE"
    assert await harness.instances(dep) == []


async def test_scale_up_and_down(harness: Harness) -> None:
    dep = await harness.deploy([workload()])
    await harness.until_status(dep, "ACTIVE")
    async with harness.maker() as session, session.begin():
        await session.execute(
            update(DeploymentSpec)
            .where(DeploymentSpec.deployment_id == dep.id)
            .values(min_instances=3, max_instances=3)
        )
        await session.execute(
            update(Deployment).where(Deployment.id == dep.id).values(generation=2, due_at=ASAP)
        )

    async def three_running() -> bool:
        running = [i for i in await harness.instances(dep) if i.phase == "Running"]
        return len(running) == 3 and await harness.status(dep) == "ACTIVE"

    await harness.drive(three_running)
    async with harness.maker() as session, session.begin():
        await session.execute(
            update(DeploymentSpec)
            .where(DeploymentSpec.deployment_id == dep.id)
            .values(min_instances=1)
        )
        await session.execute(
            update(Deployment).where(Deployment.id == dep.id).values(generation=3, due_at=ASAP)
        )

    async def one_left() -> bool:
        present = await harness.instances(dep, present_only=True)
        return len(present) == 1 and not any(
            i.applied for i in await harness.instances(dep) if i.desired == "absent"
        )

    await harness.drive(one_left)
    assert await harness.status(dep) == "ACTIVE"
    assert len(await namespaces(harness.sim(), await harness.instances(dep))) == 1
    assert len(await harness.events(dep, "scaling")) == 2


async def test_undeploy_deletes_instances_then_records(harness: Harness) -> None:
    dep = await harness.deploy([workload()], min_instances=2)
    await harness.until_status(dep, "ACTIVE")
    instances = await harness.instances(dep)
    assert len(await namespaces(harness.sim(), instances)) == 2
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

    async def gone() -> bool:
        async with harness.maker() as session:
            return await session.get(Deployment, dep.id) is None

    await harness.drive(gone)
    assert await namespaces(harness.sim(), instances) == []
    assert await harness.instances(dep) == []
    assert await harness.status(dep) == "INACTIVE"
    # kept as history (deployments/history.py): the entry, and the timeline ending in removal
    async with harness.maker() as session:
        kept = await session.get(DeploymentHistory, dep.id)
    assert kept is not None and kept.failed_instances == []
    assert kept.expires_at == kept.removed_at + timedelta(days=7)
    assert (await harness.events(dep))[-1].reason == "Removed"


# ------------------------------------------------------------------------------- faults


async def _failure(
    harness: Harness, objects: list[dict[str, Any]], reason: str, **deploy: Any
) -> Instance:
    dep = await harness.deploy(objects, **deploy)
    await harness.until_status(dep, "ERROR", step=2.0)
    [inst] = await harness.instances(dep)
    assert (inst.phase, inst.reason, inst.desired, inst.applied) == (
        "Failed",
        reason,
        "absent",
        False,
    ), inst.message
    assert await namespaces(harness.sim(), [inst]) == []
    status = (await harness.events(dep, "status"))[-1]
    assert status.reason == reason and "DEPLOYING → ERROR" in status.message
    # Not retried while deploying: no new instance appears.
    for _ in range(3):
        await harness.reconciler.run_once()
        harness.clock.advance(5)
    assert len(await harness.instances(dep)) == 1
    assert await harness.status(dep) == "ERROR"
    return inst


async def test_image_pull_backoff_errors_after_image_pull_timeout(harness: Harness) -> None:
    inst = await _failure(harness, [workload(fault="ImagePullBackOff")], "ImagePullIssues")
    assert "cannot pull image" in (inst.message or "")
    # Failed only after the image-pull timeout (10 s) ran from when it was first seen.
    assert inst.since - inst.created_at >= timedelta(seconds=TIMEOUTS.image_pull)


async def test_unschedulable_pod_is_stuck_scheduling(harness: Harness) -> None:
    await _failure(harness, [workload(fault="Unschedulable")], "PodStuckScheduling")


async def test_too_few_gpus_waits_for_capacity_then_errors(harness: Harness) -> None:
    # Four nodes of 8 H100: four 8-GPU instances fill them, so the next one cannot be placed.
    big = await harness.deploy([workload(gpus=8)], instance_type="NCP.GPU.H100_8x", min_instances=4)
    await harness.until_status(big, "ACTIVE")
    dep = await harness.deploy([workload()])
    await harness.reconciler.run_once()
    [inst] = await harness.instances(dep)
    assert (inst.phase, inst.reason, inst.cluster) == ("Scheduling", "AwaitingCapacity", None)
    assert "no candidate cluster has room" in (inst.message or "")
    await _assert_errors(harness, dep, "PodStuckScheduling")


async def _assert_errors(harness: Harness, dep: Deployment, reason: str) -> None:
    await harness.until_status(dep, "ERROR", step=2.0)
    [inst] = await harness.instances(dep)
    assert (inst.phase, inst.reason) == ("Failed", reason)


async def test_crash_loop_is_containers_in_restart_loop(harness: Harness) -> None:
    # Restarts back off (10 s, 20 s, …): keep the startup timeout out of the way.
    harness.reconciler = harness.new_reconciler(
        timeouts=dataclasses.replace(TIMEOUTS, worker_startup=10_000)
    )
    await _failure(harness, [workload(fault="CrashLoopBackOff")], "ContainersInRestartLoop")


async def test_never_ready_hits_startup_timeout(harness: Harness) -> None:
    await _failure(harness, [workload(fault="NeverReady")], "WorkerStartupTimeout")


async def test_fail_after_ready_degrades_then_is_replaced(harness: Harness) -> None:
    notes = {"sim.nvcf.io/fail-after": "5s"}
    dep = await harness.deploy([workload(fault="FailAfterReady", annotations=notes)])
    await harness.until_status(dep, "ACTIVE")
    [first] = await harness.instances(dep)
    await harness.until_status(dep, "DEGRADED")
    [degraded] = await harness.instances(dep)
    assert degraded.phase == "Degraded"

    async def replaced() -> bool:
        present = await harness.instances(dep, present_only=True)
        return bool(present) and present[0].id != first.id

    await harness.drive(replaced)
    old = next(i for i in await harness.instances(dep) if i.id == first.id)
    assert (old.phase, old.reason, old.desired) == ("Failed", "WorkerDegraded", "absent")
    await harness.until_status(dep, "ACTIVE")
    statuses = [e.message.split("status ")[1] for e in await harness.events(dep, "status")]
    assert statuses[:3] == ["DEPLOYING → ACTIVE", "ACTIVE → DEGRADED", "DEGRADED → ACTIVE"]


async def test_failing_side_job_fails_default_mode(harness: Harness) -> None:
    objects = [
        workload("worker"),
        service("worker-svc", "worker"),
        workload("side", gpus=0, fault="NeverReady", kind="Job", restart_policy="Never"),
    ]
    # judged through the Job (its backoffLimit), not through its failed pod
    await _failure(harness, objects, "JobFailed", service_name="worker-svc")


async def test_worker_readiness_mode_ignores_side_job(harness: Harness) -> None:
    objects = [
        workload("worker"),
        service("worker-svc", "worker"),
        workload("side", gpus=0, fault="NeverReady", kind="Job", restart_policy="Never"),
    ]
    dep = await harness.deploy(
        objects, flags={"StatusByWorkerReadiness": True}, service_name="worker-svc"
    )
    await harness.until_status(dep, "ACTIVE")
    for _ in range(5):
        await harness.reconciler.run_once()
        harness.clock.advance(5)
    assert await harness.status(dep) == "ACTIVE"
    [inst] = await harness.instances(dep)
    assert inst.phase == "Running" and inst.condition is not None
    assert any("side" in o["object"] for o in inst.condition["observations"])


async def test_worker_readiness_mode_still_fails_on_the_worker(harness: Harness) -> None:
    objects = [workload("worker", fault="NeverReady"), service("worker-svc", "worker")]
    await _failure(
        harness,
        objects,
        "WorkerStartupTimeout",
        flags={"StatusByWorkerReadiness": True},
        service_name="worker-svc",
    )


# ------------------------------------------------------------------------------- errors


class Broken:
    """An adapter whose every operation fails."""

    def __init__(self, name: str, *, retryable: bool = False) -> None:
        self.name = name
        self.retryable = retryable

    async def apply(self, instance: InstanceSpec, objects: list[dict[str, Any]]) -> None:
        raise AdapterError("admission webhook denied the request", retryable=self.retryable)

    async def update_objects(self, instance: InstanceSpec, objects: list[dict[str, Any]]) -> None:
        raise AdapterError("admission webhook denied the request", retryable=self.retryable)

    async def observe(self, instance: InstanceSpec) -> ObservedState:
        raise AdapterError("connection refused", retryable=True)

    async def delete(self, instance: InstanceSpec) -> bool:
        return True

    async def endpoint(self, instance: InstanceSpec, port: WorkerPort) -> WorkerEndpoint:
        raise AdapterError("connection refused", retryable=True)

    async def logs(self, instance: InstanceSpec, request: LogRequest) -> AsyncIterator[LogLine]:
        raise AdapterError("connection refused", retryable=True)
        yield  # an async generator  # pragma: no cover

    async def capacity(self) -> Capacity:
        return await SimulatedAdapter(self.name, provider="NCP", nodes=[_shape()]).capacity()

    async def aclose(self) -> None:
        return None


def _shape() -> Any:
    from service.backends.protocol import NodeShape

    return NodeShape("H100", 8, 1)


async def test_adapter_error_fails_the_instance_not_the_reconciler(harness: Harness) -> None:
    broken: BackendAdapter = Broken("sim-b")
    registry = AdapterRegistry({"sim-a": harness.sim(), "sim-b": broken})
    rec = harness.new_reconciler(registry)
    bad = await harness.deploy([workload()], candidates=("sim-b",))
    good = await harness.deploy([workload()])
    await harness.until_status(bad, "ERROR", reconciler=rec)
    [inst] = await harness.instances(bad)
    assert inst.reason == "BackendError"
    assert "admission webhook denied the request" in (inst.message or "")
    assert "sim-b" in (inst.message or "")
    await harness.until_status(good, "ACTIVE", reconciler=rec)


async def test_unavailable_cluster_fails_instances_naming_it(harness: Harness) -> None:
    registry = AdapterRegistry(
        {"sim-a": harness.sim()},
        unavailable={"prod-k8s": "cluster prod-k8s is unavailable: no kubeconfig"},
    )
    rec = harness.new_reconciler(registry)
    dep = await harness.deploy([workload()], candidates=("prod-k8s",))
    await harness.until_status(dep, "ERROR", reconciler=rec)
    [inst] = await harness.instances(dep)
    assert inst.reason == "ClusterUnavailable"
    assert "prod-k8s" in (inst.message or "")


async def test_registry_marks_unbuildable_kubernetes_cluster_unavailable() -> None:
    data = catalog_data(
        extra_clusters=[
            {
                "name": "prod-a",
                "adapter": "kubernetes",
                "provider": "DGXC",
                "region": "us-west-2",
                "nodes": [{"gpu": "L40S", "gpusPerNode": 1, "count": 1}],
                "kubernetes": {"kubeconfig": "/nonexistent/kubeconfig", "context": "x"},
            }
        ]
    )
    registry = AdapterRegistry.from_catalog(Catalog.from_data(data))
    assert registry.get("sim-a") is not None
    if registry.get("prod-a") is None:
        reason = registry.unavailable_reason("prod-a")
        assert reason is not None and "prod-a" in reason
    await registry.aclose()


async def test_counts_rows_once_per_instance(harness: Harness) -> None:
    dep = await harness.deploy([workload()], min_instances=3)
    await harness.until_status(dep, "ACTIVE")
    async with harness.maker() as session:
        count = await session.scalar(
            select(func.count()).select_from(Instance).where(Instance.deployment_id == dep.id)
        )
    assert count == 3


# ------------------------------------------------------------------------- DEPLOYING rule


def _failing_once(instances: int = 1) -> dict[str, Any]:
    """A workload whose image cannot be pulled in the first `instances` instances only."""
    return workload(
        fault="ImagePullBackOff",
        annotations={"sim.nvcf.io/fault-instances": str(instances)},
    )


async def test_one_failure_of_two_is_replaced_then_active(harness: Harness) -> None:
    dep = await harness.deploy([_failing_once()], min_instances=2)
    await harness.until_status(dep, "ACTIVE", step=2.0)
    rows = await harness.instances(dep)
    failed = [r for r in rows if r.phase == "Failed"]
    running = [r for r in rows if r.desired == "present"]
    assert len(failed) == 1 and failed[0].reason == "ImagePullIssues"
    assert len(running) == 2 and all(r.phase == "Running" for r in running)
    assert failed[0].id not in {r.id for r in running}  # a new instance id replaced it
    statuses = [e.message for e in await harness.events(dep, "status")]
    assert statuses == ["function version status DEPLOYING → ACTIVE"]
    async with harness.maker() as session:
        spec = (
            await session.execute(
                select(DeploymentSpec).where(DeploymentSpec.deployment_id == dep.id)
            )
        ).scalar_one()
    assert (spec.attempts, spec.failures) == (3, 1)


async def test_every_instance_tried_failing_is_error_with_the_reason(harness: Harness) -> None:
    dep = await harness.deploy([workload(fault="ImagePullBackOff")], min_instances=2)
    await harness.until_status(dep, "ERROR", step=2.0)
    rows = await harness.instances(dep)
    assert rows and all(r.phase == "Failed" and r.reason == "ImagePullIssues" for r in rows)
    assert len(rows) <= 2 * 3  # within the attempts: minInstances × 3
    status = (await harness.events(dep, "status"))[-1]
    assert status.reason == "ImagePullIssues"
    assert "DEPLOYING → ERROR" in status.message and "instances tried failed" in status.message
    assert await namespaces(harness.sim(), rows) == []
    for _ in range(3):  # ERROR is final: nothing more is tried
        await harness.reconciler.run_once()
        harness.clock.advance(5)
    assert len(await harness.instances(dep)) == len(rows)


async def test_attempts_are_bounded_by_the_setting(harness: Harness) -> None:
    # One attempt per instance of the minimum: the failed instance is not replaced, and with
    # its sibling Running the spec cannot reach 2, so the version goes to ERROR.
    harness.reconciler = harness.new_reconciler(deploy_attempts=1)
    dep = await harness.deploy([_failing_once()], min_instances=2)
    await harness.until_status(dep, "ERROR", step=2.0)
    rows = await harness.instances(dep)
    assert len(rows) == 2
    status = (await harness.events(dep, "status"))[-1]
    assert "out of attempts" in status.message and "1 of 2 Running" in status.message
    # the same fault with attempts left is replaced and ends ACTIVE
    harness.reconciler = harness.new_reconciler(deploy_attempts=2)
    again = await harness.deploy([_failing_once()], min_instances=2)
    await harness.until_status(again, "ACTIVE", step=2.0)
    assert len(await harness.instances(again)) == 3


# ------------------------------------------------------------------------------- restarts


async def test_a_running_instances_restart_keeps_the_run_that_ended(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A container of a Running instance restarts (its pod stays ready): the run that ended
    is kept with the instance and shown by the deployment; the backend's logs are read only
    when a restart count went up, never on the passes in between."""
    from service.deployments.views import deployment_view

    sim = harness.sim()
    restarts = {"count": 0}
    reads: list[LogRequest] = []
    observe, logs = sim.observe, sim.logs

    async def restarting_observe(instance: InstanceSpec) -> ObservedState:
        seen = await observe(instance)
        pods = tuple(
            dataclasses.replace(
                pod,
                container_statuses=tuple(
                    dataclasses.replace(s, restart_count=restarts["count"])
                    for s in pod.container_statuses
                ),
            )
            for pod in seen.pods
        )
        return dataclasses.replace(seen, pods=pods)

    async def previous_run(instance: InstanceSpec, request: LogRequest) -> AsyncIterator[LogLine]:
        reads.append(request)
        if not request.previous:
            async for line in logs(instance, request):
                yield line
            return
        for pod in (await observe(instance)).pods:
            for s in pod.container_statuses:
                yield LogLine(pod.name, s.name, f"run {restarts['count']}: Traceback")
                yield LogLine(pod.name, s.name, "RuntimeError: CUDA out of memory")

    monkeypatch.setattr(sim, "observe", restarting_observe)
    monkeypatch.setattr(sim, "logs", previous_run)
    rec = harness.new_reconciler(resync_seconds=60)
    dep = await harness.deploy([workload()])
    await harness.until_status(dep, "ACTIVE", reconciler=rec)

    async def shown() -> list[list[str] | None]:
        async with harness.maker() as session:
            found = await session.get(Deployment, dep.id)
            assert found is not None
            view = await deployment_view(session, found)
        return [i.last_logs for i in view.instances]

    # each step is past the instance's next resync slot (half a period to one and a half
    # after the last: reconcile/resync.py)
    for _ in range(3):  # resyncs with nothing restarted: no log is read, nothing is kept
        harness.clock.advance(91)
        await rec.run_once()
    assert reads == [] and await shown() == [None]

    restarts["count"] = 1
    harness.clock.advance(91)
    await rec.run_once()
    [kept] = await shown()
    assert kept is not None and len(kept) == 2
    assert kept[0].endswith("/main previous] run 1: Traceback")
    assert kept[1].endswith("previous] RuntimeError: CUDA out of memory")
    assert [r.previous for r in reads] == [True]
    [inst] = await harness.instances(dep)
    assert inst.phase == "Running"  # a restart alone does not fail the instance

    for _ in range(3):  # the same count again: not read again
        harness.clock.advance(91)
        await rec.run_once()
    assert len(reads) == 1

    restarts["count"] = 2  # the next restart's run replaces the one kept before
    harness.clock.advance(91)
    await rec.run_once()
    [kept] = await shown()
    assert kept is not None and kept[0].endswith("run 2: Traceback") and len(kept) == 2
    assert len(reads) == 2


def test_restart_counts_unknown_before_keep_nothing() -> None:
    """A fresh reconciler (a restarted server) knows no earlier counts: it takes the first
    counts it sees as they are instead of keeping a run it cannot date."""
    from service.deployments.logs.keep import restarted

    assert restarted(None, {("p", "c"): 4}) == frozenset()
    assert restarted({("p", "c"): 4}, {("p", "c"): 4, ("q", "c"): 9}) == frozenset()
    assert restarted({("p", "c"): 4}, {("p", "c"): 5}) == {("p", "c")}
