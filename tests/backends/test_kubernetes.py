"""Kubernetes backend: the adapter drives its real client library (lightkube) against the local
test API server of tests/support/fake_k8s.py, with `kubectl get -o json` status fixtures fed
through observe into the health machine."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.backends import AdapterError, BackendAdapter, InstanceSpec, NodeShape
from service.backends.kubernetes import (
    APPLIED_ANNOTATION,
    FIELD_MANAGER,
    KNOWN_KINDS,
    KubernetesAdapter,
    guess_plural,
    kind_info,
)
from service.charts.mutate import mutate_for_install
from service.clusters.adapters import adapter_for_cluster
from service.clusters.catalog import Cluster
from service.core.kube import MANAGED_BY_LABEL
from service.health import HealthTimeouts, InstanceCondition, ObservedState, Phase, evaluate
from tests.support.fake_k8s import (
    FakeKubernetes,
    fixture,
    forbidden_body,
    invalid_body,
    iter_fixture_items,
    quota_body,
)
from tests.support.kube_objects import PULL_SECRET, chart_objects, install, instance

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)  # creation time of the fixture objects
TIMEOUTS = HealthTimeouts()


# ------------------------------------------------------------------------------ fixtures


@pytest.fixture
def server() -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as fake:
        yield fake


@pytest.fixture
def kubeconfig(server: FakeKubernetes, tmp_path: Path) -> Path:
    return server.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
async def adapter(kubeconfig: Path) -> AsyncIterator[KubernetesAdapter]:
    k8s = KubernetesAdapter(
        "k8s-test", kubeconfig=kubeconfig, context="fake", nodes=[NodeShape("H100", 8, 2)]
    )
    yield k8s
    await k8s.aclose()


def ns_path(inst: InstanceSpec) -> str:
    return f"/api/v1/namespaces/{inst.namespace}"


def versions(server: FakeKubernetes, namespace: str) -> dict[str, str]:
    objs = [*server.objects(namespace), server.get("Namespace", None, namespace)]
    return {
        f"{o['kind']}/{o['metadata']['name']}": o["metadata"]["resourceVersion"]
        for o in objs
        if o is not None
    }


# ------------------------------------------------------------------------------ apply


async def test_apply_creates_the_mutated_objects_in_dependency_order(
    server: FakeKubernetes, adapter: KubernetesAdapter
) -> None:
    inst = instance()
    objects = install(inst)
    assert [o["kind"] for o in objects] == ["Secret", "Deployment", "Service"]

    await adapter.apply(inst, objects)

    ns = inst.namespace
    assert server.patches() == [
        f"/api/v1/namespaces/{ns}",
        f"/api/v1/namespaces/{ns}/secrets/{PULL_SECRET}",
        f"/api/v1/namespaces/{ns}/services/web",
        f"/apis/apps/v1/namespaces/{ns}/deployments/web",
    ]
    for request in server.requests:
        assert request.method == "PATCH"
        assert request.content_type == "application/apply-patch+yaml"
        assert request.query["fieldManager"] == FIELD_MANAGER
        assert request.query["force"] == "true"

    namespace = server.get("Namespace", None, ns)
    assert namespace is not None
    labels = namespace["metadata"]["labels"]
    assert labels["nvcf.nvidia.com/function-id"] == "fn-1"
    assert labels["nvcf.nvidia.com/function-version-id"] == "ver-1"
    assert labels["nvcf.nvidia.com/instance-id"] == "inst-1"
    assert labels["nvcf.nvidia.com/nca-id"] == "nca-1"
    assert labels[MANAGED_BY_LABEL] == FIELD_MANAGER
    assert json.loads(namespace["metadata"]["annotations"][APPLIED_ANNOTATION]) == [
        ["apps/v1", "Deployment", "web"],
        ["v1", "Secret", PULL_SECRET],
        ["v1", "Service", "web"],
    ]

    stored = {f"{o['kind']}/{o['metadata']['name']}": o for o in server.objects(ns)}
    assert sorted(stored) == ["Deployment/web", f"Secret/{PULL_SECRET}", "Service/web"]
    assert stored[f"Secret/{PULL_SECRET}"]["type"] == "kubernetes.io/dockerconfigjson"

    # The Deployment arrives exactly as mutate_for_install produced it.
    deployment = stored["Deployment/web"]
    assert deployment["spec"] == objects[1]["spec"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": PULL_SECRET}]
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert env["NVCF_FUNCTION_ID"] == "fn-1"
    assert env["NVCF_REGION"] == "us-west-2"  # replaced the chart's value
    term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"][0]["matchExpressions"] == [
        {"key": "nvca.nvcf.nvidia.io/instance-type", "operator": "In", "values": ["NCP.GPU.H100"]}
    ]
    assert deployment["metadata"]["labels"]["nvcf.nvidia.com/instance-id"] == "inst-1"
    assert deployment["metadata"]["namespace"] == ns


async def test_apply_orders_every_allowed_kind_and_the_compute_domain_last(
    server: FakeKubernetes, adapter: KubernetesAdapter
) -> None:
    inst = instance()
    extra: list[dict[str, Any]] = [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "warmup"},
            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": []}}},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"},
            "subjects": [{"kind": "ServiceAccount", "name": "worker"}],
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "cache"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "r"},
            "rules": [],
        },
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "worker"}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {"a": "1"}},
    ]
    objects = install(inst, chart_objects(*extra), nvlink=True)
    await adapter.apply(inst, objects)

    kinds = [p.split("/")[-2] for p in server.patches()]
    assert kinds == [
        "namespaces",
        "secrets",
        "configmaps",
        "serviceaccounts",
        "roles",
        "rolebindings",
        "persistentvolumeclaims",
        "services",
        "deployments",
        "jobs",
        "computedomains",
    ]
    assert server.patches()[-1] == (
        f"/apis/resource.nvidia.com/v1beta1/namespaces/{inst.namespace}/computedomains/"
        "nvcf-cd-index-0"
    )
    assert server.get("ComputeDomain", inst.namespace, "nvcf-cd-index-0") is not None


async def test_repeated_apply_changes_nothing(
    server: FakeKubernetes, adapter: KubernetesAdapter
) -> None:
    inst = instance()
    await adapter.apply(inst, install(inst))
    before = versions(server, inst.namespace)
    assert len(before) == 4

    await adapter.apply(inst, install(inst))
    assert versions(server, inst.namespace) == before

    # A real change touches exactly the changed object.
    changed = install(inst)
    changed[1]["spec"]["replicas"] = 2
    await adapter.apply(inst, changed)
    after = versions(server, inst.namespace)
    assert {k for k in after if after[k] != before[k]} == {"Deployment/web"}


async def test_secrets_secret_is_created_mounted_then_updated_in_place(
    server: FakeKubernetes, adapter: KubernetesAdapter
) -> None:
    inst = instance()
    objects = mutate_for_install(
        chart_objects(),
        namespace=inst.namespace,
        instance_id=inst.instance_id,
        function_id=inst.function_id,
        version_id=inst.version_id,
        function_name="echo",
        nca_id=inst.nca_id,
        instance_type=inst.instance_type,
        backend="k8s-group",
        region="us-west-2",
        secrets={"API_TOKEN": "one"},
    )
    await adapter.apply(inst, objects)
    ns = inst.namespace
    secret = server.get("Secret", ns, "nvcf-secrets")
    assert secret is not None and secret["type"] == "Opaque"
    assert json.loads(base64.b64decode(secret["data"]["secrets.json"])) == {"API_TOKEN": "one"}
    pod = server.get("Deployment", ns, "web")
    assert pod is not None
    template = pod["spec"]["template"]["spec"]
    assert {"name": "nvcf-secrets", "secret": {"secretName": "nvcf-secrets"}} in template["volumes"]
    assert template["containers"][0]["volumeMounts"] == [
        {"name": "nvcf-secrets", "mountPath": "/var/secrets", "readOnly": True}
    ]
    before = versions(server, ns)
    recorded = server.get("Namespace", None, ns)
    assert recorded is not None
    applied = recorded["metadata"]["annotations"][APPLIED_ANNOTATION]
    server.requests.clear()

    rotated = mutate_for_install(
        chart_objects(),
        namespace=inst.namespace,
        instance_id=inst.instance_id,
        function_id=inst.function_id,
        version_id=inst.version_id,
        function_name="echo",
        nca_id=inst.nca_id,
        instance_type=inst.instance_type,
        backend="k8s-group",
        region="us-west-2",
        secrets={"API_TOKEN": "two", "EXTRA": "three"},
    )
    await adapter.update_objects(inst, [o for o in rotated if o["kind"] == "Secret"])
    # one server-side apply of the Secret alone: the namespace's record and the workload stay
    assert server.patches() == [f"/api/v1/namespaces/{ns}/secrets/nvcf-secrets"]
    [request] = server.requests
    assert request.query["fieldManager"] == FIELD_MANAGER
    after = versions(server, ns)
    assert {k for k in after if after[k] != before[k]} == {"Secret/nvcf-secrets"}
    secret = server.get("Secret", ns, "nvcf-secrets")
    assert secret is not None
    assert json.loads(base64.b64decode(secret["data"]["secrets.json"])) == {
        "API_TOKEN": "two",
        "EXTRA": "three",
    }
    recorded = server.get("Namespace", None, ns)
    assert recorded is not None
    assert recorded["metadata"]["annotations"][APPLIED_ANNOTATION] == applied


async def test_invalid_objects_are_refused_before_any_request(
    server: FakeKubernetes, adapter: KubernetesAdapter
) -> None:
    inst = instance()
    wrong_ns = install(inst)
    wrong_ns[1]["metadata"]["namespace"] = "default"
    with pytest.raises(AdapterError) as caught:
        await adapter.apply(inst, wrong_ns)
    assert caught.value.retryable is False
    assert "does not match the namespace" in caught.value.message

    with pytest.raises(AdapterError, match="Kind"):
        await adapter.apply(inst, [{"metadata": {"name": "x"}}])
    with pytest.raises(AdapterError, match="cluster-scoped"):
        await adapter.apply(inst, [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}}])
    assert server.requests == []


# ------------------------------------------------------------------------------ observe + health


def place(server: FakeKubernetes, name: str, inst: InstanceSpec) -> dict[str, Any]:
    """Let the fake 'kubelet/controllers' create a fixture object in the instance namespace."""
    obj = fixture(name)
    obj["metadata"]["namespace"] = inst.namespace
    if obj["kind"] == "Event":
        obj["involvedObject"]["namespace"] = inst.namespace
    return server.add_object(obj, namespace=inst.namespace)


async def applied(server: FakeKubernetes, adapter: KubernetesAdapter) -> InstanceSpec:
    inst = instance()
    await adapter.apply(inst, install(inst))
    server.add_object(fixture("replicaset-available.json"), namespace=inst.namespace)
    return inst


def progress(observed: ObservedState, *seconds: float) -> InstanceCondition:
    """Evaluate at T0 + each offset in turn, carrying the condition forward."""
    condition: InstanceCondition | None = None
    for offset in seconds:
        condition = evaluate(observed, condition, T0 + timedelta(seconds=offset), TIMEOUTS)
    assert condition is not None
    return condition


async def test_observe_running_pod_is_running(
    server: FakeKubernetes, adapter: KubernetesAdapter
) -> None:
    inst = await applied(server, adapter)
    place(server, "pod-running.json", inst)
    server.set_status(
        "Deployment", inst.namespace, "web", fixture("deployment-available.json")["status"]
    )

    observed = await adapter.observe(inst)

    assert [p.name for p in observed.pods] == ["web-7c9f8d6b5d-8xk2p"]
    pod = observed.pods[0]
    assert pod.worker and pod.ready and pod.node_name == "h100-node-1"
    assert {c.ref for c in observed.controllers} == {c.ref for c in observed.controllers if c.ready}
    assert {str(r) for r in observed.expected} == {
        "Deployment/web",
        f"Secret/{PULL_SECRET}",
        "Service/web",
    }
    assert observed.missing == ()
    condition = progress(observed, 0)
    assert condition.phase is Phase.RUNNING, condition.to_json()


async def test_pods_not_selected_by_the_worker_service_are_not_workers(
    server: FakeKubernetes, adapter: KubernetesAdapter
) -> None:
    inst = await applied(server, adapter)
    pod = fixture("pod-running.json")
    pod["metadata"]["labels"] = {"app": "sidecar"}
    server.add_object(pod, namespace=inst.namespace)
    observed = await adapter.observe(inst)
    assert [p.worker for p in observed.pods] == [False]

    everyone = await adapter.observe(instance(worker_service=None))
    assert [p.worker for p in everyone.pods] == [True]


async def test_image_pull_backoff_fails_after_the_image_pull_timeout(
    server: FakeKubernetes, adapter: KubernetesAdapter
) -> None:
    inst = await applied(server, adapter)
    place(server, "pod-imagepullbackoff.json", inst)
    observed = await adapter.observe(inst)

    first = progress(observed, 0)
    assert first.phase is Phase.STARTING
    assert first.reason == "ImagePullBackOff"
    failed = progress(observed, 0, TIMEOUTS.image_pull + 1)
    assert failed.phase is Phase.FAILED
    assert failed.reason == "ImagePullIssues"
    assert "nvcr.io/acme/inference:does-not-exist" in failed.message


async def test_unschedulable_pod_fails_after_the_scheduling_timeout(
    server: FakeKubernetes, adapter: KubernetesAdapter
) -> None:
    inst = await applied(server, adapter)
    place(server, "pod-unschedulable.json", inst)
    place(server, "event-failedscheduling.json", inst)
    observed = await adapter.observe(inst)

    assert [(e.reason, e.involved_name, e.count) for e in observed.events] == [
        ("FailedScheduling", "web-7c9f8d6b5d-m5t9w", 4)
    ]
    assert observed.events[0].first_time is not None  # from eventTime (firstTimestamp is null)
    waiting = progress(observed, 60)
    assert waiting.phase is Phase.SCHEDULING
    assert waiting.reason == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in waiting.message
    failed = progress(observed, 60, TIMEOUTS.pod_scheduling + 1)
    assert failed.phase is Phase.FAILED
    assert failed.reason == "PodStuckScheduling"


async def test_crash_loop_fails_after_the_restart_loop_timeout(
    server: FakeKubernetes, adapter: KubernetesAdapter
) -> None:
    inst = await applied(server, adapter)
    place(server, "pod-crashloopbackoff.json", inst)
    observed = await adapter.observe(inst)

    assert observed.pods[0].container_statuses[0].restart_count == 5
    first = progress(observed, 0)
    assert first.phase is Phase.STARTING
    assert first.reason == "CrashLoopBackOff"
    failed = progress(observed, 0, TIMEOUTS.restart_loop + 1)
    assert failed.phase is Phase.FAILED
    assert failed.reason == "ContainersInRestartLoop"
    assert "restarted 5 times, last exit code 1" in failed.message


async def test_failed_job_fails_the_instance_at_once(
    server: FakeKubernetes, adapter: KubernetesAdapter
) -> None:
    inst = instance()
    job = fixture("job-failed.json")
    chart_job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "warmup"},
        "spec": {"backoffLimit": 6, "template": job["spec"]["template"]},
    }
    await adapter.apply(inst, install(inst, chart_objects(chart_job)))
    server.set_status("Job", inst.namespace, "warmup", job["status"])

    condition = progress(await adapter.observe(inst), 0)
    assert condition.phase is Phase.FAILED
    assert condition.reason == "JobFailed"
    assert "BackoffLimitExceeded" in condition.message


async def test_progress_deadline_exceeded_fails_the_instance_at_once(
    server: FakeKubernetes, adapter: KubernetesAdapter
) -> None:
    inst = await applied(server, adapter)
    place(server, "pod-running.json", inst)
    server.set_status(
        "Deployment",
        inst.namespace,
        "web",
        fixture("deployment-progress-deadline.json")["status"],
    )
    condition = progress(await adapter.observe(inst), 0)
    assert condition.phase is Phase.FAILED
    assert condition.reason == "ProgressDeadlineExceeded"
    assert 'ReplicaSet "web-7c9f8d6b5d" has timed out progressing.' in condition.message


async def test_an_applied_object_deleted_behind_our_back_is_missing(
    server: FakeKubernetes, adapter: KubernetesAdapter
) -> None:
    inst = await applied(server, adapter)
    place(server, "pod-running.json", inst)
    server.remove_object("Service", inst.namespace, "web")
    observed = await adapter.observe(inst)
    assert [str(r) for r in observed.missing] == ["Service/web"]
    condition = progress(observed, 0)
    assert condition.phase is Phase.FAILED
    assert condition.reason == "ObjectMissing"


async def test_observe_of_an_unknown_instance_is_empty(adapter: KubernetesAdapter) -> None:
    observed = await adapter.observe(instance(99))
    assert observed == ObservedState()


# ------------------------------------------------------------------------------ delete / GC


async def test_delete_removes_the_namespace_in_the_foreground(
    server: FakeKubernetes, adapter: KubernetesAdapter
) -> None:
    inst = instance()
    await adapter.apply(inst, install(inst))
    server.terminating_reads = 1

    assert await adapter.delete(inst) is False
    deletes = [r for r in server.requests if r.method == "DELETE"]
    assert [(r.path, r.query.get("propagationPolicy")) for r in deletes] == [
        (ns_path(inst), "Foreground")
    ]
    assert await adapter.delete(inst) is False  # still Terminating
    assert len([r for r in server.requests if r.method == "DELETE"]) == 1
    assert await adapter.delete(inst) is True
    assert server.get("Namespace", None, inst.namespace) is None
    assert server.objects(inst.namespace) == []
    assert await adapter.delete(inst) is True  # idempotent


async def test_delete_of_a_namespace_that_never_existed_is_done(
    adapter: KubernetesAdapter,
) -> None:
    assert await adapter.delete(instance(42)) is True


async def test_garbage_collect_deletes_only_unknown_instance_namespaces(
    server: FakeKubernetes, adapter: KubernetesAdapter
) -> None:
    for n in (1, 2, 3):
        await adapter.apply(instance(n), install(instance(n)))
    # Namespaces this service does not own: never touched.
    server.add_object(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "sr-handmade"}}
    )
    server.add_object(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": "sr-other-plane",
                "labels": {
                    MANAGED_BY_LABEL: "another-control-plane",
                    "nvcf.nvidia.com/instance-id": "other-plane",
                },
            },
        }
    )
    server.add_object(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": "team-a",
                "labels": {MANAGED_BY_LABEL: FIELD_MANAGER, "nvcf.nvidia.com/instance-id": "x"},
            },
        }
    )

    # young namespaces are spared: another replica may have just created their instance
    assert await adapter.garbage_collect(["inst-1"], min_age_seconds=3600) == []
    assert await adapter.garbage_collect(["inst-1"]) == ["sr-inst-2", "sr-inst-3"]
    deleted = [r.path for r in server.requests if r.method == "DELETE"]
    assert deleted == ["/api/v1/namespaces/sr-inst-2", "/api/v1/namespaces/sr-inst-3"]
    for name in ("sr-inst-1", "sr-handmade", "sr-other-plane", "team-a"):
        ns = server.get("Namespace", None, name)
        assert ns is not None and ns["status"]["phase"] == "Active", name
    # Already terminating: not deleted again.
    assert await adapter.garbage_collect(["inst-1"]) == []


# ------------------------------------------------------------------------------ errors


async def test_forbidden_is_an_adapter_error_with_the_server_message(
    server: FakeKubernetes, adapter: KubernetesAdapter
) -> None:
    inst = instance()
    body = forbidden_body("patch", "deployments", "apps", "web", inst.namespace)
    server.inject_error("PATCH", f"/apis/apps/v1/namespaces/{inst.namespace}/deployments/web", body)
    with pytest.raises(AdapterError) as caught:
        await adapter.apply(inst, install(inst))
    err = caught.value
    assert err.message == body["message"]
    assert err.status == 403
    assert err.retryable is False


async def test_invalid_object_is_not_retryable(
    server: FakeKubernetes, adapter: KubernetesAdapter
) -> None:
    inst = instance()
    body = invalid_body(
        "Deployment", "apps", "web", "spec.template.spec.containers[0].image", "Required value"
    )
    server.inject_error("PATCH", f"/apis/apps/v1/namespaces/{inst.namespace}/deployments/web", body)
    with pytest.raises(AdapterError) as caught:
        await adapter.apply(inst, install(inst))
    assert caught.value.message == (
        'Deployment.apps "web" is invalid: spec.template.spec.containers[0].image: Required value'
    )
    assert caught.value.status == 422
    assert caught.value.retryable is False


async def test_exceeded_quota_is_retryable(
    server: FakeKubernetes, adapter: KubernetesAdapter
) -> None:
    inst = instance()
    body = quota_body("services", "web", "object-counts", "services", 10)
    server.inject_error("PATCH", f"/api/v1/namespaces/{inst.namespace}/services/web", body)
    with pytest.raises(AdapterError) as caught:
        await adapter.apply(inst, install(inst))
    assert caught.value.message == body["message"]
    assert "exceeded quota" in caught.value.message
    assert caught.value.status == 403
    assert caught.value.retryable is True
    # The Deployment was never applied: order stops at the failing Service.
    assert server.get("Deployment", inst.namespace, "web") is None


async def test_forbidden_read_during_observe(
    server: FakeKubernetes, adapter: KubernetesAdapter
) -> None:
    inst = await applied(server, adapter)
    body = forbidden_body("list", "events", "", "", inst.namespace)
    server.inject_error("GET", f"/api/v1/namespaces/{inst.namespace}/events", body)
    with pytest.raises(AdapterError) as caught:
        await adapter.observe(inst)
    assert caught.value.message == body["message"]


async def test_stopped_server_is_a_retryable_error(
    server: FakeKubernetes, adapter: KubernetesAdapter
) -> None:
    inst = instance()
    await adapter.apply(inst, install(inst))
    server.stop()
    for call in (adapter.observe(inst), adapter.delete(inst), adapter.capacity()):
        with pytest.raises(AdapterError) as caught:
            await call
        assert caught.value.retryable is True
        assert "cannot reach the Kubernetes API server of cluster k8s-test" in (
            caught.value.message
        )
        assert server.url in caught.value.message


async def test_timeout_is_a_retryable_error(server: FakeKubernetes, kubeconfig: Path) -> None:
    k8s = KubernetesAdapter("slow", kubeconfig=kubeconfig, context="fake", timeout=0.2)
    inst = instance()
    release = server.hold("GET", ns_path(inst))
    try:
        with pytest.raises(AdapterError) as caught:
            await k8s.observe(inst)
        assert caught.value.retryable is True
        assert "timed out" in caught.value.message
    finally:
        release.set()
        await k8s.aclose()


async def test_wrong_token_is_unauthorized(server: FakeKubernetes, tmp_path: Path) -> None:
    config = server.write_kubeconfig(tmp_path / "kc")
    config.write_text(config.read_text().replace(server.token, "stolen"))
    k8s = KubernetesAdapter("k", kubeconfig=config, context="fake")
    with pytest.raises(AdapterError) as caught:
        await k8s.observe(instance())
    assert (caught.value.status, caught.value.message, caught.value.retryable) == (
        401,
        "Unauthorized",
        False,
    )
    await k8s.aclose()


async def test_configuration_problems_are_adapter_errors(
    server: FakeKubernetes, kubeconfig: Path, tmp_path: Path
) -> None:
    missing = KubernetesAdapter("k", kubeconfig=tmp_path / "nope")
    with pytest.raises(AdapterError, match="cannot load the Kubernetes configuration"):
        await missing.capacity()
    unknown = KubernetesAdapter("k", kubeconfig=kubeconfig, context="nope")
    with pytest.raises(AdapterError, match="Context 'nope' not found") as caught:
        await unknown.observe(instance())
    assert caught.value.retryable is False
    # Without a context the kubeconfig's current context (a closed port) is used.
    current = KubernetesAdapter("k", kubeconfig=kubeconfig)
    with pytest.raises(AdapterError, match="cannot reach"):
        await current.observe(instance())
    await current.aclose()
    with pytest.raises(ValueError, match="either a kubeconfig"):
        KubernetesAdapter("k")
    # Outside a pod there is no service account: an error, not a crash.
    in_cluster = KubernetesAdapter("k", in_cluster=True)
    with pytest.raises(AdapterError, match="from in-cluster service account") as caught:
        await in_cluster.apply(instance(), install(instance()))
    assert caught.value.retryable is False
    assert server.requests == []


# ------------------------------------------------------------------------------ capacity


def add_nodes(server: FakeKubernetes) -> None:
    for node in iter_fixture_items("nodes.json"):
        server.add_object(node)


def gpu_pod(name: str, namespace: str, gpus: int, node: str | None) -> dict[str, Any]:
    pod = fixture("pod-running.json")
    pod["metadata"]["name"] = name
    pod["metadata"].pop("uid")
    container = pod["spec"]["containers"][0]
    container["resources"]["limits"]["nvidia.com/gpu"] = str(gpus)
    container["resources"]["requests"]["nvidia.com/gpu"] = str(gpus)
    if node is None:
        del pod["spec"]["nodeName"]
        pod["status"] = {"phase": "Pending", "qosClass": "Guaranteed"}
    else:
        pod["spec"]["nodeName"] = node
    pod["metadata"]["namespace"] = namespace
    return pod


async def test_capacity_from_labelled_nodes_minus_requested_gpus(
    server: FakeKubernetes, adapter: KubernetesAdapter
) -> None:
    add_nodes(server)
    server.add_object(gpu_pod("a", "sr-inst-a", 1, "h100-node-1"))
    server.add_object(gpu_pod("b", "kube-system", 4, "h100-node-2"))
    done = gpu_pod("c", "sr-inst-c", 8, "h100-node-2")
    done["status"]["phase"] = "Succeeded"
    server.add_object(done)
    # Ours, created but not bound yet: counted on the best-fitting matching node.
    server.add_object(gpu_pod("d", "sr-inst-d", 2, None))
    # Unschedulable: holds no GPUs.
    stuck = fixture("pod-unschedulable.json")
    stuck["metadata"]["namespace"] = "sr-inst-e"
    server.add_object(stuck)

    capacity = await adapter.capacity()

    shapes = {(s.gpu, s.gpus_per_node): s.free_per_node for s in capacity.shapes}
    # h100-node-3 is cordoned, l40s-node-2 NotReady, cpu-node-1 unlabelled.
    assert shapes == {("H100", 8): (7, 2), ("L40S", 1): (1,)}
    assert capacity.free_gpus("H100") == 9
    assert capacity.fits("H100", 4) and not capacity.fits("H100", 8)
    node_list = next(r for r in server.requests if r.path == "/api/v1/nodes")
    assert node_list.query["labelSelector"] == "nvca.nvcf.nvidia.io/instance-type"
    pod_list = next(r for r in server.requests if r.path == "/api/v1/pods")
    assert set(pod_list.query["fieldSelector"].split(",")) == {
        "status.phase!=Succeeded",
        "status.phase!=Failed",
    }


async def test_capacity_falls_back_to_static_shapes_without_node_access(
    server: FakeKubernetes, adapter: KubernetesAdapter
) -> None:
    add_nodes(server)
    server.inject_error("GET", "/api/v1/nodes", forbidden_body("list", "nodes", "", "", ""))
    capacity = await adapter.capacity()
    assert [(s.gpu, s.gpus_per_node, s.free_per_node) for s in capacity.shapes] == [
        ("H100", 8, (8, 8))
    ]


async def test_capacity_without_pod_access_uses_allocatable(
    server: FakeKubernetes, adapter: KubernetesAdapter
) -> None:
    add_nodes(server)
    server.add_object(gpu_pod("a", "sr-inst-a", 1, "h100-node-1"))
    server.inject_error("GET", "/api/v1/pods", forbidden_body("list", "pods", "", "", ""))
    capacity = await adapter.capacity()
    assert capacity.free_gpus("H100") == 16


async def test_capacity_errors_other_than_forbidden_propagate(
    server: FakeKubernetes, adapter: KubernetesAdapter
) -> None:
    server.inject_error(
        "GET",
        "/api/v1/nodes",
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "etcdserver: request timed out",
            "reason": "InternalError",
            "code": 500,
        },
    )
    with pytest.raises(AdapterError) as caught:
        await adapter.capacity()
    assert caught.value.message == "etcdserver: request timed out"
    assert caught.value.retryable is True


# ------------------------------------------------------------------------------ wiring


def catalog_cluster(settings: dict[str, Any]) -> Cluster:
    return Cluster.model_validate(
        {
            "name": "prod-a",
            "adapter": "kubernetes",
            "provider": "NCP",
            "region": "us-west-2",
            "nodes": [{"gpu": "L40S", "gpusPerNode": 1, "count": 8}],
            "kubernetes": settings,
        }
    )


async def test_adapter_for_a_catalog_cluster(server: FakeKubernetes, kubeconfig: Path) -> None:
    k8s = adapter_for_cluster(catalog_cluster({"kubeconfig": str(kubeconfig), "context": "fake"}))
    assert isinstance(k8s, BackendAdapter)
    assert (k8s.name, k8s.context, k8s.in_cluster) == ("prod-a", "fake", False)
    assert k8s.static_capacity().free_gpus("L40S") == 8
    add_nodes(server)
    assert (await k8s.capacity()).free_gpus("L40S") == 1
    await k8s.aclose()

    in_cluster = adapter_for_cluster(catalog_cluster({"inCluster": True}))
    assert in_cluster.in_cluster and in_cluster.kubeconfig is None

    simulated = Cluster.model_validate(
        {
            "name": "sim",
            "adapter": "simulated",
            "provider": "NCP",
            "region": "r",
            "nodes": [{"gpu": "H100", "gpusPerNode": 8, "count": 1}],
        }
    )
    with pytest.raises(ValueError, match="not a kubernetes cluster"):
        adapter_for_cluster(simulated)


async def test_each_adapter_talks_only_to_its_cluster(
    server: FakeKubernetes, adapter: KubernetesAdapter, tmp_path: Path
) -> None:
    with FakeKubernetes() as other:
        config = other.write_kubeconfig(tmp_path / "other")
        second = KubernetesAdapter("k8s-other", kubeconfig=config, context="fake")
        inst = instance(7)
        await second.apply(inst, install(inst))
        await second.aclose()
        assert other.get("Namespace", None, inst.namespace) is not None
    assert server.get("Namespace", None, inst.namespace) is None
    assert server.requests == []


def test_kind_table_and_plural_guessing() -> None:
    assert kind_info("apps/v1", "Deployment").path("sr-1", "web") == (
        "/apis/apps/v1/namespaces/sr-1/deployments/web"
    )
    assert kind_info("v1", "Namespace").path(None, "sr-1") == "/api/v1/namespaces/sr-1"
    assert kind_info("resource.nvidia.com/v1beta1", "ComputeDomain").plural == "computedomains"
    extra = kind_info("monitoring.coreos.com/v1", "ServiceMonitor")
    assert (extra.group, extra.version, extra.plural) == (
        "monitoring.coreos.com",
        "v1",
        "servicemonitors",
    )
    assert [guess_plural(k) for k in ("NetworkPolicy", "Ingress", "Widget")] == [
        "networkpolicies",
        "ingresses",
        "widgets",
    ]


def test_clusterrole_grants_exactly_the_verbs_the_adapter_uses() -> None:
    manifest = Path(__file__).parents[2] / "deploy" / "clusterrole.yaml"
    docs = list(yaml.safe_load_all(manifest.read_text()))
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    binding = next(d for d in docs if d["kind"] == "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "nvcf-control-plane", "namespace": "nvcf-system"}
    ]
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    workload = {"get", "list", "watch", "patch", "create", "delete"}
    expected = {(k.group, k.plural): workload for k in KNOWN_KINDS}
    expected[("", "namespaces")] = {"create", "get", "list", "patch", "delete"}
    expected[("", "nodes")] = {"get", "list"}
    expected[("", "events")] = {"get", "list", "watch"}
    # invocations through the API server's service proxy (every HTTP method a caller may use)
    expected[("", "services/proxy")] = {"get", "create", "update", "patch", "delete"}
    # a task's files from its pod's sidecar (GET), and its release before deletion (POST)
    expected[("", "pods/proxy")] = {"get", "create"}
    for rbac in ("roles", "rolebindings"):
        expected[("rbac.authorization.k8s.io", rbac)] = workload | {"escalate", "bind"}
    assert granted == expected
