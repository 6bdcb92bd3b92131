"""Kubernetes clusters end to end through the HTTP API, with the reconciler running in the app.

The catalog file holds a `kubernetes` cluster served by the local test API server
(tests/support/fake_k8s.py), a `kubernetes` cluster whose kubeconfig points at a closed
127.0.0.1 port, and a simulated cluster. The tests play the kubelet and controllers by adding
nodes and pods to the test server and setting statuses; every wait polls with a deadline.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import socket
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from sqlalchemy import select

from service.backends.kubernetes import FIELD_MANAGER, MANAGED_BY_LABEL, KubernetesAdapter
from service.backends.protocol import BackendAdapter
from service.clusters.adapters import AdapterRegistry
from service.deployments.exported import followed
from service.deployments.models import Instance
from service.deployments.reconcile import CollectorConfig, NamespaceCollector
from service.deployments.reconcile.store import ReconcileStore
from tests.support.api import CONTAINER_FN, create_fn
from tests.support.app import AppClient, ClientFactory
from tests.support.fake_k8s import FakeKubernetes, fixture, iter_fixture_items
from tests.support.telemetries import create_telemetry

V = "/v2/nvcf"
GROUP = "k8s-e2e"
FAST = {
    "reconcile_interval": 0.05,
    "reconcile_resync_seconds": 0.1,
    "reconcile_gc_seconds": 0.1,
    "reconcile_gc_min_age_seconds": 0,
    "health_image_pull_timeout": 0.5,
    "health_pod_scheduling_timeout": 30.0,
}
INSTANCE_LABEL = "nvcf.nvidia.com/instance-id"


# ------------------------------------------------------------------------------ set-up


@pytest.fixture
def server() -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as fake:
        yield fake


def closed_port() -> int:
    """A 127.0.0.1 port nothing listens on (bound once by us, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def unreachable_kubeconfig(path: Path) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "down", "cluster": {"server": f"http://127.0.0.1:{closed_port()}"}}],
        "users": [{"name": "tester", "user": {"token": "unused-token"}}],
        "contexts": [{"name": "down", "context": {"cluster": "down", "user": "tester"}}],
        "current-context": "down",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def write_catalog(tmp_path: Path, server: FakeKubernetes) -> Path:
    """Group `k8s-e2e`: `k8s-a` (the test server), `k8s-down` (closed port), `sim-a`."""
    h100 = [{"gpu": "H100", "gpusPerNode": 8, "count": 2}]
    data = {
        "clusterGroups": [
            {
                "name": GROUP,
                "clusters": [
                    {
                        "name": "k8s-a",
                        "adapter": "kubernetes",
                        "provider": "NCP",
                        "region": "us-west-2",
                        "nodes": h100,
                        "kubernetes": {
                            "kubeconfig": str(server.write_kubeconfig(tmp_path / "k8s-a.yaml")),
                            "context": "fake",
                        },
                    },
                    {
                        "name": "k8s-down",
                        "adapter": "kubernetes",
                        "provider": "NCP",
                        "region": "us-west-2",
                        "nodes": h100,
                        "kubernetes": {
                            "kubeconfig": str(unreachable_kubeconfig(tmp_path / "down.yaml"))
                        },
                    },
                    {
                        "name": "sim-a",
                        "adapter": "simulated",
                        "provider": "NCP",
                        "region": "us-east-1",
                        "nodes": h100,
                        "simulation": {
                            "scheduleSeconds": 0.02,
                            "pullSeconds": 0.02,
                            "readySeconds": 0.05,
                        },
                    },
                ],
            }
        ]
    }
    path = tmp_path / "clusters.yaml"
    path.write_text(json.dumps(data))
    return path


async def start(
    client_factory: ClientFactory, tmp_path: Path, server: FakeKubernetes, **overrides: Any
) -> AppClient:
    return await client_factory(
        clusters_file=write_catalog(tmp_path, server), **{**FAST, **overrides}
    )


def add_nodes(server: FakeKubernetes) -> None:
    """h100-node-1/-2 usable (8 × H100 each), h100-node-3 cordoned, L40S and CPU nodes."""
    for node in iter_fixture_items("nodes.json"):
        server.add_object(node)


# ------------------------------------------------------------------------------ helpers


async def eventually(check: Callable[[], Awaitable[Any]], *, seconds: float = 30.0) -> Any:
    """Poll until `check()` returns something truthy; fail after the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        value = await check()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"condition not reached within {seconds}s")
        await asyncio.sleep(0.05)


def dep_url(fn: dict[str, Any]) -> str:
    return f"{V}/deployments/functions/{fn['id']}/versions/{fn['versionId']}"


async def deploy(client: AppClient, fn: dict[str, Any], **spec: Any) -> dict[str, Any]:
    body = {"gpu": "H100", "minInstances": 1, "maxInstances": 1, **spec}
    if "clusters" not in spec:
        body["backend"] = GROUP
    resp = await client.post(dep_url(fn), json={"deploymentSpecifications": [body]})
    assert resp.status_code == 200, resp.text
    return dict(resp.json()["deployment"])


async def status(client: AppClient, fn: dict[str, Any]) -> str:
    resp = await client.get(f"{V}/functions/{fn['id']}/versions/{fn['versionId']}")
    assert resp.status_code == 200, resp.text
    return str(resp.json()["function"]["status"])


async def until_status(client: AppClient, fn: dict[str, Any], wanted: str) -> None:
    async def check() -> bool:
        return await status(client, fn) == wanted

    await eventually(check)


async def deployment(client: AppClient, fn: dict[str, Any]) -> dict[str, Any]:
    resp = await client.get(dep_url(fn))
    assert resp.status_code == 200, resp.text
    return dict(resp.json()["deployment"])


async def events(client: AppClient, deployment_id: str) -> list[dict[str, Any]]:
    resp = await client.get(f"{V}/deployments/{deployment_id}/events")
    assert resp.status_code == 200, resp.text
    return list(resp.json()["events"])


def collector(client: AppClient) -> NamespaceCollector:
    found = client.app.state.namespace_collector
    assert isinstance(found, NamespaceCollector)
    return found


def our_namespaces(server: FakeKubernetes) -> list[dict[str, Any]]:
    return [
        o
        for o in server.objects()
        if o["kind"] == "Namespace"
        and (o["metadata"].get("labels") or {}).get(MANAGED_BY_LABEL) == FIELD_MANAGER
    ]


def terminating(obj: dict[str, Any] | None) -> bool:
    return obj is None or "deletionTimestamp" in obj["metadata"]


async def applied_namespace(server: FakeKubernetes) -> str:
    """The one instance namespace, once its workload Deployment has been applied."""

    async def check() -> str | None:
        for ns in our_namespaces(server):
            name = str(ns["metadata"]["name"])
            if server.get("Deployment", name, "inference") is not None:
                return name
        return None

    name: str = await eventually(check)
    return name


def secrets_json(server: FakeKubernetes, namespace: str) -> dict[str, str]:
    """The `secrets.json` of the instance's Secret on the API server."""
    secret = server.get("Secret", namespace, "nvcf-secrets")
    assert secret is not None
    return dict(json.loads(base64.b64decode(secret["data"]["secrets.json"])))


def run_pod(server: FakeKubernetes, namespace: str) -> None:
    """Play the controllers and kubelet: a Running + Ready pod of the applied Deployment."""
    applied = server.get("Deployment", namespace, "inference")
    assert applied is not None
    pod = fixture("pod-running.json")
    template = applied["spec"]["template"]
    pod["metadata"]["name"] = "inference-7c9f8d6b5d-8xk2p"
    pod["metadata"]["labels"] = dict(template["metadata"]["labels"])
    pod["metadata"].pop("ownerReferences", None)
    pod["spec"]["containers"][0]["name"] = template["spec"]["containers"][0]["name"]
    server.add_object(pod, namespace=namespace)
    server.set_status(
        "Deployment", namespace, "inference", fixture("deployment-available.json")["status"]
    )


# ------------------------------------------------------------------------------ tests


async def test_container_function_on_kubernetes_deploy_active_undeploy(
    server: FakeKubernetes, client_factory: ClientFactory, tmp_path: Path
) -> None:
    add_nodes(server)
    client = await start(client_factory, tmp_path, server)
    fn = await create_fn(client, secrets=[{"name": "API_TOKEN", "value": "first-value"}])
    dep = await deploy(client, fn, clusters=["k8s-a"])
    assert dep["functionStatus"] == "DEPLOYING"

    namespace = await applied_namespace(server)
    instance_id = namespace.removeprefix("sr-")
    uuid.UUID(instance_id)  # sr-<instanceId>

    # The namespace and the objects carry the install-time mutations (helm.md §5).
    ns = server.get("Namespace", None, namespace)
    assert ns is not None
    labels = ns["metadata"]["labels"]
    assert labels["nvcf.nvidia.com/function-id"] == fn["id"]
    assert labels["nvcf.nvidia.com/function-version-id"] == fn["versionId"]
    assert labels[INSTANCE_LABEL] == instance_id
    assert labels[MANAGED_BY_LABEL] == FIELD_MANAGER
    assert sorted(f"{o['kind']}/{o['metadata']['name']}" for o in server.objects(namespace)) == [
        "Deployment/inference",
        "Secret/nvcf-secrets",
        "Service/entrypoint",
    ]
    assert secrets_json(server, namespace) == {"API_TOKEN": "first-value"}
    workload = server.get("Deployment", namespace, "inference")
    assert workload is not None
    assert workload["metadata"]["labels"]["nvcf.nvidia.com/instance-id"] == instance_id
    pod_spec = workload["spec"]["template"]["spec"]
    assert {"name": "nvcf-secrets", "secret": {"secretName": "nvcf-secrets"}} in pod_spec["volumes"]
    assert {"name": "nvcf-secrets", "mountPath": "/var/secrets", "readOnly": True} in pod_spec[
        "containers"
    ][0]["volumeMounts"]
    env = {e["name"]: e.get("value") for e in pod_spec["containers"][0]["env"]}
    assert env["NVCF_FUNCTION_ID"] == fn["id"]
    term = pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"][0]["matchExpressions"] == [
        {"key": "nvca.nvcf.nvidia.io/instance-type", "operator": "In", "values": ["NCP.GPU.H100"]}
    ]
    assert pod_spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] in ("1", 1)
    for request in server.requests:
        if request.method == "PATCH":
            assert request.content_type == "application/apply-patch+yaml"
            assert request.query["fieldManager"] == FIELD_MANAGER

    # Placement asked the cluster for its labelled nodes.
    assert any(
        r.path == "/api/v1/nodes"
        and r.query.get("labelSelector") == "nvca.nvcf.nvidia.io/instance-type"
        for r in server.requests
    )
    assert await status(client, fn) == "DEPLOYING"

    run_pod(server, namespace)
    await until_status(client, fn, "ACTIVE")
    [inst] = (await deployment(client, fn))["instances"]
    assert (inst["instanceId"], inst["cluster"], inst["phase"]) == (
        instance_id,
        "k8s-a",
        "Running",
    )

    # A secrets update: the Secret alone is applied again, the workload is left alone.
    before = server.get("Deployment", namespace, "inference")
    assert before is not None
    workload_version = before["metadata"]["resourceVersion"]
    server.requests.clear()
    resp = await client.put(
        f"{V}/secrets/functions/{fn['id']}/versions/{fn['versionId']}",
        json={"secrets": [{"name": "API_TOKEN", "value": "second-value"}]},
    )
    assert resp.status_code == 204, resp.text

    async def rotated() -> bool:
        return secrets_json(server, namespace) == {"API_TOKEN": "second-value"}

    await eventually(rotated)
    patched = {r.path for r in server.requests if r.method == "PATCH"}
    assert patched == {f"/api/v1/namespaces/{namespace}/secrets/nvcf-secrets"}
    now = server.get("Deployment", namespace, "inference")
    assert now is not None and now["metadata"]["resourceVersion"] == workload_version
    assert await status(client, fn) == "ACTIVE"

    resp = await client.delete(dep_url(fn))
    assert resp.status_code == 200, resp.text
    await until_status(client, fn, "INACTIVE")

    async def namespace_gone() -> bool:
        return server.get("Namespace", None, namespace) is None

    await eventually(namespace_gone)
    deletes = [r for r in server.requests if r.method == "DELETE"]
    assert [r.path for r in deletes] == [f"/api/v1/namespaces/{namespace}"]
    # The namespace is deleted in the foreground, with everything in it.
    body = deletes[0].body or {}
    assert deletes[0].query.get("propagationPolicy", body.get("propagationPolicy")) == (
        "Foreground"
    )
    assert server.objects(namespace) == []


async def test_unreachable_cluster_fails_its_deployment_only(
    server: FakeKubernetes, client_factory: ClientFactory, tmp_path: Path
) -> None:
    client = await start(client_factory, tmp_path, server)  # the server starts
    resp = await client.get(f"{V}/functions")
    assert resp.status_code == 200, resp.text

    doomed = await create_fn(client, name="doomed")
    healthy = await create_fn(client, name="healthy")
    either = await create_fn(client, name="either")
    await deploy(client, doomed, clusters=["k8s-down"])
    await deploy(client, healthy, clusters=["sim-a"])
    # Both candidates offer H100: the capacity error of k8s-down must not stop placement.
    await deploy(client, either, clusters=["k8s-down", "sim-a"])

    await until_status(client, doomed, "ERROR")
    await until_status(client, healthy, "ACTIVE")
    await until_status(client, either, "ACTIVE")

    dep = await deployment(client, doomed)
    errors = [h["error"] for h in dep["healthInfo"] or []]
    assert errors and all("k8s-down" in e for e in errors), dep
    assert any("cannot reach the Kubernetes API server" in e for e in errors), errors
    reasons = [e for e in await events(client, dep["deploymentId"]) if e.get("reason") is not None]
    assert any(
        e["reason"] == "ClusterUnavailable" and "k8s-down" in e["message"] for e in reasons
    ), reasons
    for fn in (healthy, either):
        [inst] = (await deployment(client, fn))["instances"]
        assert (inst["cluster"], inst["phase"]) == ("sim-a", "Running")


async def test_placement_uses_the_capacity_of_the_kubernetes_nodes(
    server: FakeKubernetes, client_factory: ClientFactory, tmp_path: Path
) -> None:
    # The catalog says 2 × 8 H100, but the cluster has no labelled GPU node yet: the instance
    # waits for capacity instead of being applied.
    client = await start(client_factory, tmp_path, server)
    fn = await create_fn(client)
    await deploy(client, fn, clusters=["k8s-a"], instanceType="NCP.GPU.H100_8x")

    async def waiting() -> dict[str, Any] | None:
        instances = (await deployment(client, fn))["instances"]
        if instances and "k8s-a has 0 free H100" in (instances[0]["message"] or ""):
            return dict(instances[0])
        return None

    inst = await eventually(waiting)
    assert (inst["phase"], inst.get("cluster")) == ("Scheduling", None)
    assert our_namespaces(server) == []

    # 8 GPUs on each usable node, 4 of node 2 taken by someone else's pod: 1 node fits _8x.
    add_nodes(server)
    busy = fixture("pod-running.json")
    busy["metadata"]["name"] = "someone-else"
    busy["spec"]["nodeName"] = "h100-node-2"
    for section in ("limits", "requests"):
        busy["spec"]["containers"][0]["resources"][section]["nvidia.com/gpu"] = "4"
    server.add_object(busy, namespace="team-a")

    namespace = await applied_namespace(server)
    run_pod(server, namespace)
    await until_status(client, fn, "ACTIVE")
    capacity = await adapter(client, "k8s-a").capacity()
    # Our running pod requests 1 GPU on h100-node-1 (from the fixture), the other pod 4.
    assert capacity.free_gpus("H100") == 16 - 1 - 4


def adapter(client: AppClient, name: str) -> KubernetesAdapter:
    found = client.app.state.adapters.get(name)
    assert isinstance(found, KubernetesAdapter)
    return found


async def test_a_quota_forbidden_replicaset_fails_its_instance_as_nvca(
    server: FakeKubernetes, client_factory: ClientFactory, tmp_path: Path
) -> None:
    # NVCA (miniservice/status.go) ends an instance on a FailedCreate warning: here the
    # ReplicaSet of the rendered Deployment cannot create its pod, refused by a ResourceQuota.
    add_nodes(server)
    client = await start(client_factory, tmp_path, server)
    fn = await create_fn(client)
    await deploy(client, fn, clusters=["k8s-a"])
    namespace = await applied_namespace(server)
    applied = server.get("Deployment", namespace, "inference")
    assert applied is not None

    replica_set = fixture("replicaset-available.json")
    replica_set["metadata"]["name"] = "inference-7c9f8d6b5d"
    replica_set["metadata"]["labels"] = dict(applied["spec"]["template"]["metadata"]["labels"])
    replica_set["metadata"]["ownerReferences"][0].update(
        name="inference", uid=applied["metadata"]["uid"]
    )
    replica_set["status"] = {"observedGeneration": 1, "replicas": 0}
    server.add_object(replica_set, namespace=namespace)
    message = (
        'Error creating: pods "inference-7c9f8d6b5d-x2k4q" is forbidden: exceeded quota: '
        "gpu-quota, requested: nvidia.com/gpu=1, used: nvidia.com/gpu=8, limited: nvidia.com/gpu=8"
    )
    event = fixture("event-failedscheduling.json")
    event["metadata"] = {"name": "inference-7c9f8d6b5d.182a4b7c9e1d3f06", "namespace": namespace}
    event["involvedObject"] = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "name": "inference-7c9f8d6b5d",
        "namespace": namespace,
        "uid": replica_set["metadata"]["uid"],
    }
    event.update(reason="FailedCreate", message=message, reportingComponent="replicaset-controller")
    server.add_object(event, namespace=namespace)
    assert not [o for o in server.objects(namespace) if o["kind"] == "Pod"]  # none created

    await until_status(client, fn, "ERROR")
    dep = await deployment(client, fn)
    assert not [i for i in dep["instances"] if i["phase"] == "Running"], dep["instances"]
    [health] = dep["healthInfo"]
    assert health["error"].startswith("FailedCreate: "), health
    assert message in health["error"], health
    timeline = await events(client, dep["deploymentId"])
    failed = [e for e in timeline if e["kind"] == "instance" and e.get("phase") == "Failed"]
    assert [e["reason"] for e in failed] == ["FailedCreate"], timeline
    assert failed[0]["instanceId"] == namespace.removeprefix("sr-")


async def test_orphaned_namespaces_are_garbage_collected(
    server: FakeKubernetes, client_factory: ClientFactory, tmp_path: Path
) -> None:
    add_nodes(server)
    client = await start(client_factory, tmp_path, server)
    fn = await create_fn(client)
    await deploy(client, fn, clusters=["k8s-a"])
    live = await applied_namespace(server)
    run_pod(server, live)
    await until_status(client, fn, "ACTIVE")

    orphan_id = str(uuid.uuid4())
    orphan = f"sr-{orphan_id}"
    server.add_object(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": orphan,
                "labels": {MANAGED_BY_LABEL: FIELD_MANAGER, INSTANCE_LABEL: orphan_id},
            },
        }
    )
    # Not ours (no labels): never touched.
    server.add_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "sr-manual"}})

    async def collected() -> bool:
        # the round records what it collected once every cluster has answered
        return terminating(server.get("Namespace", None, orphan)) and (
            ("k8s-a", orphan) in collector(client).collected
        )

    await eventually(collected)
    # The unreachable cluster's failure is recorded without stopping collection elsewhere.
    report = collector(client).last_report
    assert report is not None and "k8s-down" in report.errors
    assert not terminating(server.get("Namespace", None, live))
    assert not terminating(server.get("Namespace", None, "sr-manual"))
    assert all(ns != live for _, ns in collector(client).collected)
    assert await status(client, fn) == "ACTIVE"


class BrokenCollector:
    """An adapter whose garbage collection fails with an unexpected error."""

    name = "broken"

    async def garbage_collect(
        self, known_instance_ids: Iterable[str], *, min_age_seconds: float = 0.0
    ) -> list[str]:
        raise RuntimeError("boom")


class ClaimingCollector:
    """An adapter that reports collecting the namespaces of the given instance ids."""

    name = "claiming"

    def __init__(self, *instance_ids: str) -> None:
        self.instance_ids = instance_ids
        self.known: set[str] = set()

    async def garbage_collect(
        self, known_instance_ids: Iterable[str], *, min_age_seconds: float = 0.0
    ) -> list[str]:
        self.known = set(known_instance_ids)
        return [f"sr-{i}" for i in self.instance_ids]


async def test_garbage_collection_failures_are_isolated_and_races_reported(
    server: FakeKubernetes,
    client_factory: ClientFactory,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = await start(client_factory, tmp_path, server, reconcile_gc_seconds=0)
    fn = await create_fn(client)
    await deploy(client, fn, clusters=["sim-a"])
    await until_status(client, fn, "ACTIVE")
    [inst] = (await deployment(client, fn))["instances"]
    orphan_id = str(uuid.uuid4())
    server.add_object(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": f"sr-{orphan_id}",
                "labels": {MANAGED_BY_LABEL: FIELD_MANAGER, INSTANCE_LABEL: orphan_id},
            },
        }
    )
    claiming = ClaimingCollector(inst["instanceId"])
    registry = AdapterRegistry(
        {
            "k8s-a": adapter(client, "k8s-a"),
            "broken": cast(BackendAdapter, BrokenCollector()),
            "claiming": cast(BackendAdapter, claiming),
        }
    )
    gc = NamespaceCollector(
        ReconcileStore(client.app.state.sessionmaker, "gc-test", 60),
        registry,
        CollectorConfig(min_age=0),
    )

    report = await gc.collect()

    assert report.collected["k8s-a"] == [f"sr-{orphan_id}"]
    assert report.errors == {"broken": "RuntimeError: boom"}
    assert inst["instanceId"] in claiming.known  # every instance of the database is known
    assert "raced with instance creation" in caplog.text
    assert inst["instanceId"] in caplog.text
    assert terminating(server.get("Namespace", None, f"sr-{orphan_id}"))


async def test_a_functions_utils_container_image_is_its_sidecars_image(
    server: FakeKubernetes, client_factory: ClientFactory, tmp_path: Path
) -> None:
    add_nodes(server)
    client = await start(
        client_factory,
        tmp_path,
        server,
        worker_utils_image="nvcr.io/acme/nvcf-server:1.0",
        worker_utils_image_registries="registry.example.com",
    )
    # refused: an image from a registry the operator did not allow, or no image at all
    for image, fragment in (
        ("elsewhere.example.org/utils:1", "registry 'elsewhere.example.org' is not among"),
        ("Not An Image", "neither PYTHON, GO nor an image reference"),
    ):
        resp = await client.post(
            f"{V}/functions", json={**CONTAINER_FN, "utilsContainerImage": image}
        )
        assert resp.status_code == 400, resp.text
        [error] = resp.json()["errors"]
        assert error["field"] == "utilsContainerImage" and fragment in error["message"]

    # a listed registry: the sidecar of the function's pod runs that image
    fn = await create_fn(client, utilsContainerImage="registry.example.com/team/utils:2.1")
    await deploy(client, fn, clusters=["k8s-a"])
    namespace = await applied_namespace(server)
    workload = server.get("Deployment", namespace, "inference")
    assert workload is not None
    images = {c["name"]: c["image"] for c in workload["spec"]["template"]["spec"]["containers"]}
    assert images["nvcf-worker-utils"] == "registry.example.com/team/utils:2.1"


async def test_nvcfs_utils_selectors_and_the_operators_repository_use_the_operators_image(
    server: FakeKubernetes, client_factory: ClientFactory, tmp_path: Path
) -> None:
    add_nodes(server)
    own = "nvcr.io/acme/nvcf-server:1.0"
    client = await start(client_factory, tmp_path, server, worker_utils_image=own)
    for image, expected in (
        ("GO", own),
        ("nvcr.io/acme/nvcf-server:1.1", "nvcr.io/acme/nvcf-server:1.1"),
    ):
        fn = await create_fn(client, name=f"f{len(expected)}", utilsContainerImage=image)
        await deploy(client, fn, clusters=["k8s-a"])
        namespace = await eventually(functools.partial(_namespace_of, server, fn["versionId"]))
        workload = server.get("Deployment", namespace, "inference")
        assert workload is not None
        containers = workload["spec"]["template"]["spec"]["containers"]
        assert {c["name"]: c["image"] for c in containers}["nvcf-worker-utils"] == expected


async def _namespace_of(server: FakeKubernetes, version_id: str) -> str | None:
    for ns in our_namespaces(server):
        labels = ns["metadata"].get("labels") or {}
        name = str(ns["metadata"]["name"])
        if (
            labels.get("nvcf.nvidia.com/function-version-id") == version_id
            and server.get("Deployment", name, "inference") is not None
        ):
            return name
    return None


async def test_a_version_naming_telemetries_gets_the_collector_with_its_keys_in_a_secret(
    server: FakeKubernetes, client_factory: ClientFactory, tmp_path: Path
) -> None:
    add_nodes(server)
    client = await start(client_factory, tmp_path, server)
    telemetry = await create_telemetry(
        client, types=["LOGS", "TRACES"], secret={"name": "collector", "value": "tenant-key-9f2"}
    )
    tid = telemetry["telemetryId"]
    fn = await create_fn(client, telemetries={"logsTelemetryId": tid, "tracesTelemetryId": tid})
    await deploy(client, fn, clusters=["k8s-a"])

    namespace = await applied_namespace(server)
    workload = server.get("Deployment", namespace, "inference")
    assert workload is not None
    containers = {c["name"]: c for c in workload["spec"]["template"]["spec"]["containers"]}
    assert containers["nvcf-otel-collector"]["image"].startswith("otel/opentelemetry-collector")
    secret = server.get("Secret", namespace, "nvcf-telemetry")
    assert secret is not None
    data = secret.get("stringData") or {
        k: base64.b64decode(v).decode() for k, v in secret["data"].items()
    }
    assert data == {"NVCF_TELEMETRY_0_KEY": "tenant-key-9f2"}
    config_map = server.get("ConfigMap", namespace, "nvcf-otel-collector")
    assert config_map is not None
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    assert set(config["service"]["pipelines"]) == {"logs", "traces"}
    labels = {a["key"]: a["value"] for a in config["processors"]["resource"]["attributes"]}
    assert labels["nvcf.instance.id"] == namespace.removeprefix("sr-")
    assert labels["nvcf.function.id"] == fn["id"]
    assert labels["nvcf.account"] == fn["ncaId"]
    assert "tenant-key-9f2" not in config_map["data"]["config.yaml"]

    # the collector sends the running pod's lines: the server follows none of them (no line
    # arrives twice)
    run_pod(server, namespace)
    await until_status(client, fn, "ACTIVE")
    async with client.app.state.sessionmaker() as session:
        owner = await session.scalar(
            select(Instance.lease_owner).where(Instance.lease_owner.is_not(None)).limit(1)
        )
        assert owner is not None
        assert await followed(session, owner, client.app.state.adapters) == []


async def test_a_replaced_telemetry_key_reaches_the_collectors_secret_and_rolls_its_pods(
    server: FakeKubernetes, client_factory: ClientFactory, tmp_path: Path
) -> None:
    add_nodes(server)
    client = await start(client_factory, tmp_path, server)
    telemetry = await create_telemetry(
        client, types=["TRACES"], secret={"name": "collector", "value": "old-key-5d1"}
    )
    tid = telemetry["telemetryId"]
    fn = await create_fn(client, telemetries={"tracesTelemetryId": tid})
    dep = await deploy(client, fn, clusters=["k8s-a"])
    namespace = await applied_namespace(server)

    def keys() -> dict[str, str]:
        secret = server.get("Secret", namespace, "nvcf-telemetry")
        assert secret is not None
        return secret.get("stringData") or {
            k: base64.b64decode(v).decode() for k, v in secret["data"].items()
        }

    def checksum() -> str:
        workload = server.get("Deployment", namespace, "inference")
        assert workload is not None
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        return str(annotations["nvcf.nvidia.com/telemetry-keys-sha256"])

    assert keys() == {"NVCF_TELEMETRY_0_KEY": "old-key-5d1"}
    before = checksum()

    resp = await client.put(
        f"/v2/nvcf/secrets/telemetries/{tid}",
        json={"secret": {"name": "collector", "value": "new-key-8e4"}},
    )
    assert resp.status_code == 204, resp.text

    async def rotated() -> bool:
        # a changed pod template: the Deployment rolls its pods, whose collectors read it
        return keys() == {"NVCF_TELEMETRY_0_KEY": "new-key-8e4"} and checksum() != before

    await eventually(rotated)
    assert "new-key-8e4" not in checksum() and "old-key-5d1" not in checksum()
    workload = server.get("Deployment", namespace, "inference")
    assert workload is not None
    names = [c["name"] for c in workload["spec"]["template"]["spec"]["containers"]]
    assert names.count("nvcf-otel-collector") == 1
    # the timeline says so: the pods roll (no in-place update without a restart here)
    timeline = await client.get(f"{V}/deployments/{dep['deploymentId']}/events")
    events = timeline.json()["events"]
    [said] = [e["message"] for e in events if e.get("reason") == "SecretsUpdated"]
    assert "pods on k8s-a roll" in said and "without a restart" not in said
