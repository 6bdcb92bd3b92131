"""The worker-utils sidecar in the pod the Kubernetes adapter applies (docs/kubernetes.md §6),
against the test API server: the pod serving the function's port carries the sidecar and the
shared `emptyDir`, the Service targets the sidecar, the injected container passes the chart
policy's restricted rules; a pod that cannot be identified, or a gRPC function, is left as it
is."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from service.backends import InstanceSpec, NodeShape
from service.backends.kubernetes import KubernetesAdapter
from service.backends.worker_utils_pod import (
    CONTAINER_NAME,
    FILES_MOUNT,
    PORT_NAME,
    WorkerUtilsPod,
    inject,
)
from service.charts.policy import restrict
from service.clusters.adapters import worker_utils_pod
from service.core.settings import Settings
from tests.support.fake_k8s import FakeKubernetes
from tests.support.kube_objects import chart_objects, install, instance

POD = WorkerUtilsPod(
    image="registry.example.com/nvcf-server:1.2",
    max_asset_bytes=1000,
    max_result_bytes=2000,
    max_result_files=7,
    timeout_seconds=60,
)


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
        "k8s-test",
        kubeconfig=kubeconfig,
        context="fake",
        nodes=[NodeShape("H100", 8, 2)],
        worker_utils=POD,
    )
    yield k8s
    await k8s.aclose()


def http_instance() -> InstanceSpec:
    return replace(instance(), worker_port=8000)


def restricted(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chart with a worker that meets the restricted rules itself."""
    out = copy.deepcopy(objects)
    pod = out[0]["spec"]["template"]["spec"]
    pod["containers"][0]["securityContext"] = {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    return out


async def test_the_pod_template_carries_the_sidecar_and_the_shared_volume(
    server: FakeKubernetes, adapter: KubernetesAdapter
) -> None:
    inst = http_instance()
    objects = install(inst)
    before = copy.deepcopy(objects)
    await adapter.apply(inst, objects)
    assert objects == before  # the caller's objects are not changed

    stored = {f"{o['kind']}/{o['metadata']['name']}": o for o in server.objects(inst.namespace)}
    pod = stored["Deployment/web"]["spec"]["template"]["spec"]
    assert {"name": "nvcf-files", "emptyDir": {}} in pod["volumes"]
    worker, sidecar = pod["containers"]
    assert worker["name"] == "inference"
    assert {"name": "nvcf-files", "mountPath": FILES_MOUNT} in worker["volumeMounts"]
    assert worker["ports"] == [{"containerPort": 8000, "name": "http"}]  # the worker's own
    assert sidecar["name"] == CONTAINER_NAME
    assert sidecar["image"] == POD.image
    assert sidecar["command"] == ["nvcf-server"]
    args = sidecar["args"]
    assert args[0] == "worker-utils"
    options = dict(zip(args[1::2], args[2::2], strict=True))
    assert options == {
        "--port": "8479",
        "--worker-port": "8000",
        "--mount": FILES_MOUNT,
        "--max-asset-bytes": "1000",
        "--max-result-bytes": "2000",
        "--max-result-files": "7",
        "--timeout": "60",
        "--worker-timeout": "3600",
    }
    assert sidecar["ports"] == [{"name": PORT_NAME, "containerPort": 8479, "protocol": "TCP"}]
    assert sidecar["volumeMounts"] == [{"name": "nvcf-files", "mountPath": FILES_MOUNT}]
    assert sidecar["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "runAsGroup": 10001,
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    # the Service's port (what the platform calls) stays; its target is the sidecar
    ports = stored["Service/web"]["spec"]["ports"]
    assert ports == [{"port": 8000, "targetPort": PORT_NAME}]

    # applied again (a new revision, the same objects): one sidecar, one volume
    await adapter.apply(inst, install(inst))
    stored = {f"{o['kind']}/{o['metadata']['name']}": o for o in server.objects(inst.namespace)}
    pod = stored["Deployment/web"]["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["inference", CONTAINER_NAME]
    assert [v["name"] for v in pod["volumes"]].count("nvcf-files") == 1


def test_the_injected_container_meets_the_restricted_policy() -> None:
    objects = restricted(chart_objects())
    _, clean, _ = restrict(objects, service_name="web", inference_port=8000, enforce_security=True)
    assert inject(objects, "web", 8000, POD)
    _, findings, _ = restrict(
        objects, service_name="web", inference_port=8000, enforce_security=True
    )
    assert [f for f in findings if f.severity == "error"] == []
    assert findings == clean


def test_a_port_in_use_moves_the_sidecar_to_the_next() -> None:
    objects = chart_objects()
    worker = objects[0]["spec"]["template"]["spec"]["containers"][0]
    worker["ports"].append({"containerPort": 8479, "name": "metrics"})
    assert inject(objects, "web", 8000, POD)
    sidecar = objects[0]["spec"]["template"]["spec"]["containers"][1]
    assert sidecar["ports"][0]["containerPort"] == 8480


def test_a_pod_that_cannot_be_identified_is_left_as_it_is() -> None:
    # no such Service; the port not on the Service; two pods exposing the port
    for service, port in (("other", 8000), ("web", 9000)):
        objects = chart_objects()
        assert not inject(objects, service, port, POD)
        assert objects == chart_objects()
    twin = copy.deepcopy(chart_objects()[0])
    twin["metadata"]["name"] = "web-2"
    objects = chart_objects(twin)
    assert not inject(objects, "web", 8000, POD)
    assert objects == chart_objects(copy.deepcopy(twin))


async def test_grpc_functions_and_an_adapter_without_sidecar_apply_the_objects_as_they_are(
    server: FakeKubernetes, adapter: KubernetesAdapter, kubeconfig: Path
) -> None:
    grpc = instance()  # worker_port None: a gRPC function
    await adapter.apply(grpc, install(grpc))
    stored = {f"{o['kind']}/{o['metadata']['name']}": o for o in server.objects(grpc.namespace)}
    assert len(stored["Deployment/web"]["spec"]["template"]["spec"]["containers"]) == 1
    assert adapter.files_in_sidecar

    plain = KubernetesAdapter(
        "k8s-plain", kubeconfig=kubeconfig, context="fake", nodes=[NodeShape("H100", 8, 2)]
    )
    try:
        assert not plain.files_in_sidecar
        inst = replace(http_instance(), instance_id="inst-2")
        await plain.apply(inst, install(inst))
        stored = {f"{o['kind']}/{o['metadata']['name']}": o for o in server.objects(inst.namespace)}
        assert len(stored["Deployment/web"]["spec"]["template"]["spec"]["containers"]) == 1
    finally:
        await plain.aclose()


def test_the_settings_make_the_sidecar(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, worker_utils_image="me/nvcf-server:2", asset_max_bytes=5)
    pod = worker_utils_pod(settings)
    assert pod is not None and pod.image == "me/nvcf-server:2" and pod.max_asset_bytes == 5
    assert worker_utils_pod(Settings(data_dir=tmp_path, worker_utils_image="")) is None
