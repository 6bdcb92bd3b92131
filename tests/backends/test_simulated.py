"""Simulated backend: pod lifecycle on a fake clock, fault injection fed to the health machine,
GPU capacity accounting and node affinity."""

from __future__ import annotations

import asyncio
import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from service.backends import (
    AdapterError,
    BackendAdapter,
    InstanceSpec,
    NodeShape,
    SimulatedAdapter,
    SimulationDelays,
)
from service.health import (
    HealthMode,
    HealthTimeouts,
    InstanceCondition,
    ObservedState,
    Phase,
    evaluate,
)

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
DELAYS = SimulationDelays(schedule_seconds=1, pull_seconds=2, ready_seconds=3)
# ready at 1 (scheduled) + 2 (pulled, running) + 3 (ready) = 6 s after apply


class FakeClock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def set(self, seconds: float) -> datetime:
        self.now = T0 + timedelta(seconds=seconds)
        return self.now


def cluster(clock: FakeClock, *shapes: NodeShape, provider: str = "NCP") -> SimulatedAdapter:
    return SimulatedAdapter(
        "sim-test",
        provider=provider,
        nodes=list(shapes) or [NodeShape("H100", 8, 2)],
        delays=DELAYS,
        clock=clock,
    )


def instance(n: int = 1, gpu: str = "H100", gpus: int = 1, nodes: int = 1) -> InstanceSpec:
    return InstanceSpec(
        instance_id=f"inst-{n}",
        function_id="fn-1",
        version_id="ver-1",
        instance_type=f"NCP.GPU.{gpu}_{gpus}x",
        gpu=gpu,
        gpus_per_node=gpus,
        nodes=nodes,
        worker_service="mini-service",
    )


def affinity(value: str) -> dict[str, Any]:
    term = {"key": "nvca.nvcf.nvidia.io/instance-type", "operator": "In", "values": [value]}
    required = {"nodeSelectorTerms": [{"matchExpressions": [term]}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}


def pod_template(
    app: str,
    gpus: int,
    annotations: dict[str, str] | None,
    node_type: str | None,
    restart_policy: str | None = None,
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "inference",
        "image": "nvcr.io/acme/triton:24.08",
        "ports": [{"containerPort": 8000}],
        "resources": {"limits": {"cpu": "2", "memory": "8Gi"}},
    }
    if gpus:
        container["resources"]["limits"]["nvidia.com/gpu"] = str(gpus)
    spec: dict[str, Any] = {"containers": [container]}
    if node_type:
        spec["affinity"] = affinity(node_type)
    if restart_policy:
        spec["restartPolicy"] = restart_policy
    return {"metadata": {"labels": {"app": app}, "annotations": annotations or {}}, "spec": spec}


def deployment(
    name: str = "mini-service",
    *,
    gpus: int = 1,
    replicas: int = 1,
    annotations: dict[str, str] | None = None,
    node_type: str | None = "NCP.GPU.H100",
) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": pod_template(name, gpus, annotations, node_type),
        },
    }


def service(name: str = "mini-service", app: str = "mini-service") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": {"app": app}, "ports": [{"port": 8000, "targetPort": 8000}]},
    }


def job(name: str = "warmup", annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "template": pod_template(name, 0, annotations, None, restart_policy="Never"),
        },
    }


def faulty(fault: str, **extra: str) -> list[dict[str, Any]]:
    return [deployment(annotations={"sim.nvcf.io/fault": fault, **extra}), service()]


async def health_over_time(
    sim: SimulatedAdapter,
    clock: FakeClock,
    inst: InstanceSpec,
    times: list[float],
    timeouts: HealthTimeouts | None = None,
    mode: HealthMode = "default",
) -> list[InstanceCondition]:
    """Observe at each time and feed the health machine, as the reconciler does."""
    out: list[InstanceCondition] = []
    previous: InstanceCondition | None = None
    for t in times:
        now = clock.set(t)
        previous = evaluate(await sim.observe(inst), previous, now, timeouts, mode)
        out.append(previous)
    return out


def only_pod(observed: ObservedState, prefix: str = "mini-service") -> Any:
    (pod,) = [p for p in observed.pods if p.name.startswith(prefix)]
    return pod


def test_simulator_satisfies_the_adapter_protocol() -> None:
    assert isinstance(cluster(FakeClock()), BackendAdapter)


async def test_pods_progress_through_kubelet_phases_to_ready() -> None:
    clock = FakeClock()
    sim = cluster(clock)
    inst = instance()
    await sim.apply(inst, [deployment(), service()])

    pod = only_pod(await sim.observe(inst))
    assert (pod.phase, pod.conditions, pod.node_name) == ("Pending", (), "")

    clock.set(1.5)
    pod = only_pod(await sim.observe(inst))
    assert pod.phase == "Pending" and pod.scheduled and pod.node_name
    assert pod.container_statuses[0].waiting_reason == "ContainerCreating"

    clock.set(4)
    pod = only_pod(await sim.observe(inst))
    assert pod.phase == "Running" and not pod.ready
    assert pod.container_statuses[0].state is not None
    assert pod.container_statuses[0].state.kind == "running"

    clock.set(7)
    observed = await sim.observe(inst)
    pod = only_pod(observed)
    assert pod.ready and pod.worker
    assert pod.owner_kind == "ReplicaSet"
    dep = next(c for c in observed.controllers if c.kind == "Deployment")
    assert dep.ready_replicas == 1
    available = dep.condition("Available")
    assert available is not None and available.is_true
    assert observed.missing == ()


async def test_health_machine_sees_scheduling_starting_running() -> None:
    clock = FakeClock()
    sim = cluster(clock)
    inst = instance()
    await sim.apply(inst, [deployment(), service()])
    phases = [c.phase for c in await health_over_time(sim, clock, inst, [0, 1.5, 4, 7])]
    assert phases == [Phase.SCHEDULING, Phase.STARTING, Phase.STARTING, Phase.RUNNING]


async def test_ready_after_annotation_delays_readiness() -> None:
    clock = FakeClock()
    sim = cluster(clock)
    inst = instance()
    await sim.apply(inst, [deployment(annotations={"sim.nvcf.io/ready-after": "30s"}), service()])
    clock.set(20)
    assert not only_pod(await sim.observe(inst)).ready
    clock.set(34)
    assert only_pod(await sim.observe(inst)).ready


async def test_image_pull_backoff_becomes_image_pull_issues() -> None:
    clock = FakeClock()
    sim = cluster(clock)
    inst = instance()
    await sim.apply(inst, faulty("ImagePullBackOff"))
    clock.set(3.5)
    pod = only_pod(await sim.observe(inst))
    assert (pod.phase, pod.container_statuses[0].waiting_reason) == ("Pending", "ErrImagePull")
    clock.set(10)
    observed = await sim.observe(inst)
    assert only_pod(observed).container_statuses[0].waiting_reason == "ImagePullBackOff"
    assert {"Failed", "BackOff"} <= {e.reason for e in observed.events}

    conds = await health_over_time(sim, clock, inst, [3.5, 10, 60, 63.6])
    assert [c.phase for c in conds[:3]] == [Phase.STARTING] * 3
    assert (conds[-1].phase, conds[-1].reason) == (Phase.FAILED, "ImagePullIssues")
    assert "nvcr.io/acme/triton:24.08" in conds[-1].message


async def test_unschedulable_fault_becomes_pod_stuck_scheduling() -> None:
    clock = FakeClock()
    sim = cluster(clock)
    inst = instance()
    await sim.apply(inst, faulty("Unschedulable"))
    clock.set(5)
    observed = await sim.observe(inst)
    pod = only_pod(observed)
    cond = pod.condition("PodScheduled")
    assert cond is not None and (cond.status, cond.reason) == ("False", "Unschedulable")
    assert [e.reason for e in observed.events] == ["FailedScheduling"]

    # Shorter than the Deployment's 600 s progress deadline, which would otherwise win.
    timeouts = HealthTimeouts(pod_scheduling=120)
    conds = await health_over_time(sim, clock, inst, [5, 119, 121], timeouts)
    assert [c.phase for c in conds[:2]] == [Phase.SCHEDULING] * 2
    assert (conds[-1].phase, conds[-1].reason) == (Phase.FAILED, "PodStuckScheduling")


async def test_too_few_gpus_becomes_pod_stuck_scheduling() -> None:
    clock = FakeClock()
    sim = cluster(clock)
    inst = instance(gpus=16)
    await sim.apply(inst, [deployment(gpus=16), service()])
    clock.set(5)
    observed = await sim.observe(inst)
    cond = only_pod(observed).condition("PodScheduled")
    assert cond is not None and "2 Insufficient nvidia.com/gpu" in cond.message
    conds = await health_over_time(sim, clock, inst, [5, 599, 601])
    assert conds[1].phase is Phase.SCHEDULING
    assert conds[-1].phase is Phase.FAILED
    assert conds[-1].reason in {"PodStuckScheduling", "ProgressDeadlineExceeded"}
    # in worker-readiness mode the Deployment's progress deadline is informational only
    worker = await health_over_time(sim, clock, inst, [5, 599, 601], mode="StatusByWorkerReadiness")
    assert worker[-1].reason == "PodStuckScheduling"


async def test_crash_loop_back_off_becomes_containers_in_restart_loop() -> None:
    clock = FakeClock()
    sim = cluster(clock)
    inst = instance()
    await sim.apply(inst, faulty("CrashLoopBackOff"))
    counts = []
    for t in (5, 8, 20, 60):
        clock.set(t)
        counts.append(only_pod(await sim.observe(inst)).container_statuses[0].restart_count)
    assert counts == sorted(counts) and counts[-1] >= 3
    status = only_pod(await sim.observe(inst)).container_statuses[0]
    assert status.last_state is not None and status.last_state.exit_code == 1

    timeouts = HealthTimeouts(restart_loop=120)
    conds = await health_over_time(sim, clock, inst, [5, 60, 170, 185], timeouts)
    assert conds[1].reason == "CrashLoopBackOff" and conds[1].phase is Phase.STARTING
    assert (conds[-1].phase, conds[-1].reason) == (Phase.FAILED, "ContainersInRestartLoop")


async def test_a_crash_looping_pod_reports_that_it_was_never_ready() -> None:
    clock = FakeClock()
    sim = cluster(clock)
    inst = instance()
    await sim.apply(inst, faulty("CrashLoopBackOff"))
    clock.set(60)
    pod = only_pod(await sim.observe(inst))
    ready = pod.condition("Ready")
    assert ready is not None and ready.last_transition_time == pod.start_time
    assert pod.container_statuses[0].restart_count >= 1 and not pod.was_ready_before


async def test_min_ready_seconds_delays_availability() -> None:
    clock = FakeClock()
    sim = cluster(clock)
    inst = instance()
    slow = deployment()
    slow["spec"]["minReadySeconds"] = 20
    await sim.apply(inst, [slow, service()])
    # ready at 6 s, available at 26 s
    clock.set(10)
    observed = await sim.observe(inst)
    dep = next(c for c in observed.controllers if c.kind == "Deployment")
    rs = next(c for c in observed.controllers if c.kind == "ReplicaSet")
    assert (dep.ready_replicas, dep.available_replicas, dep.min_ready_seconds) == (1, 0, 20)
    assert rs.available_replicas == 0
    conds = await health_over_time(sim, clock, inst, [10, 25, 27])
    assert [(c.phase, c.reason) for c in conds[:2]] == [(Phase.STARTING, "ObjectsNotReady")] * 2
    assert conds[0].next_check == T0 + timedelta(seconds=26)
    assert conds[-1].phase is Phase.RUNNING


@pytest.mark.parametrize(
    ("mode", "phase"), [("default", Phase.STARTING), ("StatusByWorkerReadiness", Phase.DEGRADED)]
)
async def test_a_worker_ready_between_two_observations_is_judged_as_degraded(
    mode: HealthMode, phase: Phase
) -> None:
    clock = FakeClock()
    sim = cluster(clock)
    inst = instance()
    # launched at 1 s, ready at 6 s, not ready again from 16 s: the server looks at 3 s and
    # then only at 400 s, past the startup timeout
    await sim.apply(inst, faulty("FailAfterReady", **{"sim.nvcf.io/fail-after": "10s"}))
    timeouts = HealthTimeouts(worker_startup=300, worker_degradation=1800)
    conds = await health_over_time(sim, clock, inst, [3, 400, 1815, 1817], timeouts, mode)
    assert [(c.phase, c.reason) for c in conds[1:3]] == [(phase, "WorkerDegraded")] * 2
    assert (conds[-1].phase, conds[-1].reason) == (Phase.FAILED, "WorkerDegraded")


async def test_never_ready_hits_the_worker_startup_timeout() -> None:
    clock = FakeClock()
    sim = cluster(clock)
    inst = instance()
    await sim.apply(inst, faulty("NeverReady"))
    timeouts = HealthTimeouts(worker_startup=300)
    conds = await health_over_time(sim, clock, inst, [5, 300, 302], timeouts)
    assert conds[1].phase is Phase.STARTING
    assert (conds[-1].phase, conds[-1].reason) == (Phase.FAILED, "WorkerStartupTimeout")


async def test_never_ready_in_worker_mode_uses_the_default_two_hour_startup() -> None:
    clock = FakeClock()
    sim = cluster(clock)
    inst = instance()
    await sim.apply(inst, faulty("NeverReady"))
    conds = await health_over_time(
        sim, clock, inst, [5, 3600, 7199, 7201], mode="StatusByWorkerReadiness"
    )
    assert [c.phase for c in conds[:3]] == [Phase.STARTING] * 3
    assert "ProgressDeadlineExceeded" in {o.reason for o in conds[2].observations}
    assert (conds[-1].phase, conds[-1].reason) == (Phase.FAILED, "WorkerStartupTimeout")


async def test_fail_after_ready_degrades_then_needs_replacement() -> None:
    clock = FakeClock()
    sim = cluster(clock)
    inst = instance()
    await sim.apply(inst, faulty("FailAfterReady", **{"sim.nvcf.io/fail-after": "10s"}))
    conds = await health_over_time(sim, clock, inst, [7, 17, 20, 1815, 1817])
    assert conds[0].phase is Phase.RUNNING
    assert [(c.phase, c.reason) for c in conds[1:4]] == [(Phase.DEGRADED, "WorkerDegraded")] * 3
    assert conds[-1].phase is Phase.FAILED and conds[-1].needs_replacement
    observed = await sim.observe(inst)
    assert "Unhealthy" in {e.reason for e in observed.events}


async def test_job_with_a_fault_fails() -> None:
    clock = FakeClock()
    sim = cluster(clock)
    inst = instance()
    await sim.apply(
        inst, [deployment(), service(), job(annotations={"sim.nvcf.io/fault": "CrashLoopBackOff"})]
    )
    clock.set(10)
    observed = await sim.observe(inst)
    warmup = next(c for c in observed.controllers if c.kind == "Job")
    failed = warmup.condition("Failed")
    assert failed is not None and (failed.status, failed.reason) == ("True", "BackoffLimitExceeded")
    assert only_pod(observed, "warmup").phase == "Failed"
    cond = evaluate(observed, None, clock.now)
    assert cond.phase is Phase.FAILED and cond.reason in {
        "PodFailed",
        "ContainerFailed",
        "JobFailed",
    }
    # the worker is fine, so in worker-readiness mode the failed Job is only an observation
    worker = evaluate(observed, None, clock.now, mode="StatusByWorkerReadiness")
    assert worker.phase is Phase.RUNNING
    assert "JobFailed" in {o.reason for o in worker.observations}


async def test_job_without_fault_completes_and_releases_its_gpus() -> None:
    clock = FakeClock()
    sim = cluster(clock)
    inst = instance()
    gpu_job = job()
    gpu_job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"][
        "nvidia.com/gpu"
    ] = "8"
    await sim.apply(inst, [deployment(), service(), gpu_job])
    clock.set(2)
    assert (await sim.capacity()).free_gpus("H100") == 16 - 1 - 8
    clock.set(10)
    observed = await sim.observe(inst)
    assert only_pod(observed, "warmup").phase == "Succeeded"
    complete = next(c for c in observed.controllers if c.kind == "Job").condition("Complete")
    assert complete is not None and complete.is_true
    assert evaluate(observed, None, clock.now).phase is Phase.RUNNING
    assert (await sim.capacity()).free_gpus("H100") == 16 - 1


async def test_capacity_accounting_across_apply_and_delete() -> None:
    clock = FakeClock()
    sim = cluster(clock, NodeShape("H100", 8, 2))
    capacity = await sim.capacity()
    assert capacity.free_gpus() == 16 and capacity.fits("H100", 8, nodes=2)

    a, b = instance(1, gpus=4), instance(2, gpus=8)
    await sim.apply(a, [deployment(gpus=4), service()])
    await sim.apply(b, [deployment(gpus=8), service()])
    clock.set(2)
    capacity = await sim.capacity()
    assert capacity.free_gpus("H100") == 4
    assert capacity.shapes[0].free_per_node in ((4, 0), (0, 4))
    assert capacity.fits("H100", 4) and not capacity.fits("H100", 8)
    assert not capacity.fits("H100", 8, nodes=2)

    assert await sim.delete(b) is True
    capacity = await sim.capacity()
    assert capacity.free_gpus("H100") == 12 and capacity.fits("H100", 8)
    assert await sim.observe(b) == ObservedState()
    await sim.delete(a)
    assert (await sim.capacity()).free_gpus() == 16


async def test_pending_pod_is_scheduled_when_gpus_are_freed() -> None:
    clock = FakeClock()
    sim = cluster(clock, NodeShape("H100", 8, 1))
    first, second = instance(1, gpus=8), instance(2, gpus=8)
    await sim.apply(first, [deployment(gpus=8), service()])
    await sim.apply(second, [deployment(gpus=8), service()])
    clock.set(5)
    assert not only_pod(await sim.observe(second)).scheduled
    clock.set(50)
    await sim.delete(first)
    pod = only_pod(await sim.observe(second))
    assert pod.scheduled
    clock.set(56)
    assert only_pod(await sim.observe(second)).ready


async def test_best_fit_prefers_the_fullest_node_that_fits_then_the_first() -> None:
    clock = FakeClock()
    sim = cluster(clock, NodeShape("H100", 8, 3), NodeShape("L40S", 4, 1), provider="DGXC")
    placed: dict[str, str] = {}

    async def put(n: int, gpus: int, gpu: str = "H100") -> str:
        inst = instance(n, gpu=gpu, gpus=gpus)
        await sim.apply(inst, [deployment(gpus=gpus, node_type=f"DGXC.GPU.{gpu}"), service()])
        clock.set(clock.now.timestamp() - T0.timestamp() + 2)
        node = str(only_pod(await sim.observe(inst)).node_name)
        placed[inst.instance_id] = node
        return node

    # all H100 nodes free: ties go to the first; then the fullest node that still fits
    assert (await put(1, 5)).endswith("h100-8x-0")  # free 3, 8, 8
    assert (await put(2, 2)).endswith("h100-8x-0")  # free 1, 8, 8
    assert (await put(3, 2)).endswith("h100-8x-1")  # 1 is too few: free 1, 6, 8
    assert (await put(4, 7)).endswith("h100-8x-2")  # only node 2 fits: free 1, 6, 1
    assert (await put(5, 1)).endswith("h100-8x-0")  # two nodes with 1 free: the first
    # the L40S node is never offered to an H100 pod, and the other way round
    assert (await put(6, 1, "L40S")).endswith("l40s-4x-0")
    await sim.delete(instance(3))  # node 1 back to 8 free
    assert (await put(7, 1)).endswith("h100-8x-2")  # free 0, 8, 1: node 2 fits tightest
    capacity = await sim.capacity()
    assert capacity.free_gpus("H100") == 8 and capacity.free_gpus("L40S") == 3


async def test_node_affinity_is_respected() -> None:
    clock = FakeClock()
    sim = cluster(clock, NodeShape("H100", 8, 1), NodeShape("L40S", 1, 2), provider="DGXC")
    l40s = instance(1, gpu="L40S")
    await sim.apply(l40s, [deployment(node_type="DGXC.GPU.L40S"), service()])
    h100_label_elsewhere = instance(2)
    await sim.apply(h100_label_elsewhere, [deployment(node_type="NCP.GPU.H100"), service()])
    clock.set(2)
    assert "l40s" in only_pod(await sim.observe(l40s)).node_name
    pod = only_pod(await sim.observe(h100_label_elsewhere))
    cond = pod.condition("PodScheduled")
    assert not pod.scheduled and cond is not None
    assert "3 node(s) didn't match Pod's node affinity/selector" in cond.message
    capacity = await sim.capacity()
    assert capacity.free_gpus("H100") == 8 and capacity.free_gpus("L40S") == 1


async def test_worker_pods_are_those_selected_by_the_inference_service() -> None:
    clock = FakeClock()
    sim = cluster(clock)
    inst = instance()
    sidecar = deployment("metrics", gpus=0, node_type=None)
    await sim.apply(inst, [deployment(), sidecar, service()])
    observed = await sim.observe(inst)
    workers = {p.name.split("-")[0] for p in observed.pods if p.worker}
    others = {p.name.split("-")[0] for p in observed.pods if not p.worker}
    assert (workers, others) == ({"mini"}, {"metrics"})


async def test_statefulset_pods_and_init_containers() -> None:
    clock = FakeClock()
    sim = cluster(clock)
    inst = instance()
    template = pod_template("mini-service", 1, None, "NCP.GPU.H100")
    template["spec"]["initContainers"] = [{"name": "fetch-model", "image": "busybox"}]
    sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "triton"},
        "spec": {"replicas": 2, "serviceName": "triton", "template": template},
    }
    await sim.apply(inst, [sts, service()])
    clock.set(2)
    observed = await sim.observe(inst)
    assert sorted(p.name for p in observed.pods) == ["triton-0", "triton-1"]
    assert all(not p.initialized for p in observed.pods)
    assert evaluate(observed, None, clock.now).reason == "PodInitializing"
    clock.set(20)
    observed = await sim.observe(inst)
    assert all(p.initialized and p.ready for p in observed.pods)
    assert all(s.completed for p in observed.pods for s in p.init_container_statuses)
    assert evaluate(observed, None, clock.now).phase is Phase.RUNNING


async def test_reapplying_the_same_objects_changes_nothing() -> None:
    clock = FakeClock()
    sim = cluster(clock)
    inst = instance()
    objects = [deployment(gpus=2), service()]
    await sim.apply(inst, objects)
    clock.set(7)
    before = await sim.observe(inst)
    await sim.apply(inst, objects)
    after = await sim.observe(inst)
    assert [p.name for p in before.pods] == [p.name for p in after.pods]
    assert only_pod(after).ready
    assert (await sim.capacity()).free_gpus() == 14


async def test_invalid_objects_are_rejected_with_the_backend_message() -> None:
    sim = cluster(FakeClock())
    inst = instance()
    other_ns = deployment()
    other_ns["metadata"]["namespace"] = "kube-system"
    with pytest.raises(AdapterError, match="namespace"):
        await sim.apply(inst, [other_ns])
    with pytest.raises(AdapterError, match=r"sim\.nvcf\.io/fault"):
        await sim.apply(inst, faulty("Explode"))
    with pytest.raises(AdapterError, match="invalid duration"):
        await sim.apply(inst, [deployment(annotations={"sim.nvcf.io/ready-after": "soon"})])


async def test_concurrent_calls_keep_gpu_accounting_consistent() -> None:
    clock = FakeClock()
    sim = cluster(clock)
    instances = [instance(i) for i in range(20)]
    await asyncio.gather(
        *(sim.apply(i, [deployment(), service()]) for i in instances), sim.capacity()
    )
    clock.set(2)
    results = await asyncio.gather(*(sim.observe(i) for i in instances))
    scheduled = sum(1 for r in results if only_pod(r).scheduled)
    assert scheduled == 16
    assert (await sim.capacity()).free_gpus() == 0
    await asyncio.gather(*(sim.delete(i) for i in instances))
    assert (await sim.capacity()).free_gpus() == 16


@pytest.mark.parametrize("spelling", ["NVLinkOptimized", "nvlinkoptimized", "NVLINKOPTIMIZED"])
async def test_nvlink_clusters_label_nodes_with_a_gpu_clique(spelling: str) -> None:
    """The attribute is compared case-insensitively, as the resolver and the mutations do: a
    cluster declared `nvlinkoptimized` gets NVLink pods whose clique affinity it satisfies."""
    clock = FakeClock()
    sim = SimulatedAdapter(
        "sim-onprem",
        provider="ON-PREM",
        nodes=[NodeShape("B200", 8, 2)],
        delays=DELAYS,
        clock=clock,
        attributes=[spelling],
    )
    inst = instance(gpu="B200", gpus=8, nodes=2)
    dep = deployment(gpus=8, replicas=2, node_type="ON-PREM.GPU.B200")
    terms = dep["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    terms[0]["matchExpressions"].append({"key": "nvidia.com/gpu.clique", "operator": "Exists"})
    await sim.apply(inst, [dep, service()])
    clock.set(2)
    observed = await sim.observe(inst)
    assert len({p.node_name for p in observed.pods}) == 2
    assert (await sim.capacity()).free_gpus() == 0


async def test_capacity_counts_pods_waiting_for_the_scheduler() -> None:
    clock = FakeClock()
    sim = cluster(clock, NodeShape("H100", 8, 1))
    await sim.apply(instance(1, gpus=8), [deployment(gpus=8), service()])
    # applied a moment ago, not yet bound: its GPUs are already spoken for
    assert not (await sim.capacity()).fits("H100", 8)


async def test_observing_one_instance_is_unaffected_by_many_others() -> None:
    """An instance's observed state is the same whether it is alone or among many instances
    (with faults, jobs, pods waiting for GPUs and deletions), so observing it need not look at
    the others."""
    shapes = [NodeShape("H100", 8, 40)]
    target = instance(0, gpus=2)
    objects = [deployment(gpus=2, replicas=2), service(), job()]

    async def observe_over_time(crowd: int) -> list[ObservedState]:
        clock = FakeClock()
        sim = cluster(clock, *shapes)
        await sim.apply(target, objects)
        others = [instance(i, gpus=8) for i in range(1, crowd + 1)]
        faults = [None, "CrashLoopBackOff", "Unschedulable", "ImagePullBackOff", "NeverReady"]
        for n, other in enumerate(others):
            fault = faults[n % len(faults)]
            annotations = {"sim.nvcf.io/fault": fault} if fault else None
            await sim.apply(other, [deployment(gpus=8, annotations=annotations), service(), job()])
        seen = []
        for t in (0.5, 1.5, 4, 7, 30, 400):
            clock.set(t)
            seen.append(await sim.observe(target))
            if others:
                await sim.delete(others.pop())
        return seen

    alone = await observe_over_time(0)
    crowded = await observe_over_time(200)
    assert alone == crowded
    assert all(p.ready for p in alone[-1].pods if p.name.startswith("mini-service"))


# --------------------------------------------------------------------- fault-instances


async def test_fault_instances_hits_only_the_first_instances_of_a_version() -> None:
    clock = FakeClock()
    sim = cluster(clock)
    objects = faulty("ImagePullBackOff", **{"sim.nvcf.io/fault-instances": "1"})
    first, second = instance(1), instance(2)
    await sim.apply(first, objects)
    await sim.apply(second, objects)
    await sim.apply(first, objects)  # re-applying keeps its fault
    clock.set(10)
    assert only_pod(await sim.observe(first)).container_statuses[0].waiting_reason == (
        "ImagePullBackOff"
    )
    assert only_pod(await sim.observe(second)).ready
    # another version counts on its own
    other = InstanceSpec("inst-3", "fn-1", "ver-2", "NCP.GPU.H100_1x", "H100", 1)
    await sim.apply(other, objects)
    clock.set(20)
    assert only_pod(await sim.observe(other)).container_statuses[0].waiting_reason == (
        "ImagePullBackOff"
    )


async def test_fault_instances_must_be_a_count() -> None:
    sim = cluster(FakeClock())
    with pytest.raises(AdapterError, match="whole number") as caught:
        await sim.apply(
            instance(), faulty("ImagePullBackOff", **{"sim.nvcf.io/fault-instances": "one"})
        )
    assert caught.value.retryable is False


# --------------------------------------------------------------------- secrets


def secrets_secret(values: dict[str, str]) -> dict[str, Any]:
    content = json.dumps(values).encode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "nvcf-secrets"},
        "data": {"secrets.json": base64.b64encode(content).decode()},
    }


def mounted(obj: dict[str, Any], path: str = "/var/secrets") -> dict[str, Any]:
    pod = obj["spec"]["template"]["spec"]
    pod["volumes"] = [{"name": "s", "secret": {"secretName": "nvcf-secrets"}}]
    pod["containers"][0]["volumeMounts"] = [{"name": "s", "mountPath": path, "readOnly": True}]
    return obj


async def test_update_objects_changes_the_secret_without_touching_the_pods() -> None:
    clock = FakeClock()
    sim = cluster(clock)
    inst = instance()
    await sim.apply(inst, [secrets_secret({"A": "1"}), mounted(deployment()), service()])
    clock.set(10)
    pods = {p.name: p.uid for p in (await sim.observe(inst)).pods}
    assert sim._secret_names(inst.namespace) == ["A"]

    await sim.update_objects(inst, [secrets_secret({"A": "2", "B": "3"})])
    clock.set(11)
    observed = await sim.observe(inst)
    assert {p.name: p.uid for p in observed.pods} == pods
    assert all(p.ready for p in observed.pods)
    assert sim._secret_names(inst.namespace) == ["A", "B"]
    [secret] = [o for o in await sim.objects(inst) if o["kind"] == "Secret"]
    assert json.loads(base64.b64decode(secret["data"]["secrets.json"])) == {"A": "2", "B": "3"}


async def test_update_objects_refuses_workloads_and_unknown_instances() -> None:
    sim = cluster(FakeClock())
    with pytest.raises(AdapterError, match="not found"):
        await sim.update_objects(instance(9), [secrets_secret({})])
    await sim.apply(instance(), [deployment()])
    with pytest.raises(AdapterError, match="workloads") as caught:
        await sim.update_objects(instance(), [deployment()])
    assert caught.value.retryable is False


async def test_only_a_mount_at_var_secrets_shows_the_names() -> None:
    sim = cluster(FakeClock())
    await sim.apply(instance(1), [secrets_secret({"A": "1"}), deployment()])
    assert sim._secret_names(instance(1).namespace) == []  # not mounted
    await sim.apply(instance(2), [secrets_secret({"A": "1"}), mounted(deployment(), "/etc/x")])
    assert sim._secret_names(instance(2).namespace) == []
    await sim.apply(instance(3), [mounted(deployment())])  # mounted, no such Secret
    assert sim._secret_names(instance(3).namespace) == []


# ------------------------------------------------------------------------------ change feed


async def test_the_change_feed_reports_each_step_of_the_timeline_and_nothing_between() -> None:
    """Scheduled at 1 s, running at 3 s, Ready at 6 s: the instance is reported changed at
    those moments only; a healthy Ready pod never again by time alone; the feed says when the
    next step is due."""
    clock = FakeClock()
    sim = cluster(clock)
    await sim.apply(instance(1), [deployment(), service()])
    reported: list[float] = []
    for second in range(0, 40):
        now = clock.set(second / 2)
        if sim.take_changes(now).instance_ids == {"inst-1"}:
            reported.append(second / 2)
    assert reported == [1.0, 3.0, 6.0]
    assert sim.next_change() is None


async def test_a_crash_loop_is_reported_at_each_crash_and_restart() -> None:
    """Running at 3 s, crashes after readySeconds (6 s), restarts after kubelet's back-off of
    3 s (9 s), crashes again at 12 s, restarts after 6 s (18 s)..."""
    clock = FakeClock()
    sim = cluster(clock)
    await sim.apply(instance(1), faulty("CrashLoopBackOff"))
    reported: list[float] = []
    for second in range(0, 50):
        now = clock.set(second / 2)
        if sim.take_changes(now).instance_ids:
            reported.append(second / 2)
    assert reported == [1.0, 3.0, 6.0, 9.0, 12.0, 18.0, 21.0]
    assert sim.next_change() == T0 + timedelta(seconds=33)


def ready(observed: ObservedState) -> bool:
    return all(c.ready for p in observed.pods for c in p.container_statuses)


async def test_annotating_a_fault_on_a_running_instance_changes_it_at_once() -> None:
    clock = FakeClock()
    sim = cluster(clock)
    await sim.apply(instance(1), [deployment(), service()])
    await sim.apply(instance(2), [deployment(), service()])
    clock.set(10)
    sim.take_changes(clock.now)
    assert ready(await sim.observe(instance(1)))
    woken: list[bool] = []
    sim.watch_changes(lambda: woken.append(True))
    assert await sim.annotate_pods("inst-1", {"sim.nvcf.io/fault": "NeverReady"}) == 1
    assert woken and sim.take_changes(clock.now).instance_ids == {"inst-1"}
    assert not ready(await sim.observe(instance(1)))
    assert ready(await sim.observe(instance(2)))
    # removing the fault: Ready again
    assert await sim.annotate_pods("inst-1", {"sim.nvcf.io/fault": None}) == 1
    assert sim.take_changes(clock.now).instance_ids == {"inst-1"}
    assert ready(await sim.observe(instance(1)))
    # the instance's namespace is gone: nothing to annotate, nothing reported
    await sim.delete(instance(1))
    assert await sim.annotate_pods("inst-1", {"sim.nvcf.io/fault": "NeverReady"}) == 0
    assert sim.take_changes(clock.now).instance_ids == set()
