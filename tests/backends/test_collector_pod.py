"""The OpenTelemetry Collector sidecar of a workload naming telemetries, applied by the
Kubernetes adapter against the test API server (tests/support/fake_k8s.py): the pod with the
collector (a plain container beside a function's, a native sidecar in a task's Job), its
configuration in a ConfigMap, the keys in a Secret the container reads by `secretKeyRef`,
nothing of it a readiness gate; deletion removes the Secret with the namespace."""

from __future__ import annotations

import base64
import dataclasses
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.backends.collector_pod import (
    CONFIG_MAP,
    CONTAINER_NAME,
    KEYS_CHECKSUM,
    KEYS_SECRET,
    POD_ENV,
    CollectorPod,
    inject,
)
from service.backends.kubernetes import APPLIED_ANNOTATION, KubernetesAdapter
from service.backends.worker_utils_pod import CONTAINER_NAME as UTILS_CONTAINER
from service.backends.worker_utils_pod import WorkerUtilsPod
from service.core.db import utcnow
from service.observability.collector import Named, collector_config, workload_attributes
from service.observability.models import Kind, Telemetry
from tests.support import otelcol
from tests.support.fake_k8s import FakeKubernetes
from tests.support.kube_objects import install, instance
from tests.support.task_objects import JOB, task_instance, task_objects

IMAGE = "otel/opentelemetry-collector-contrib:0.165.1"
KEY = "glc_secret-token-value"


@pytest.fixture
def server() -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as fake:
        yield fake


@pytest.fixture
async def adapter(server: FakeKubernetes, tmp_path: Path) -> AsyncIterator[KubernetesAdapter]:
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    k8s = KubernetesAdapter(
        "k8s-test",
        kubeconfig=kubeconfig,
        context="fake",
        worker_utils=WorkerUtilsPod("nvcf-server:1", 1000, 1000, 10, 60),
        collector=CollectorPod(IMAGE),
    )
    yield k8s
    await k8s.aclose()


def grafana() -> Telemetry:
    now = utcnow()
    return Telemetry(
        id=uuid.UUID(int=7),
        account_id="nca-1",
        name="grafana",
        endpoint="https://otlp-gateway.grafana.net/otlp",
        protocol="HTTP",
        provider="GRAFANA_CLOUD",
        types=["LOGS", "METRICS", "TRACES"],
        secret_ciphertext="",
        created_at=now,
        updated_at=now,
    )


def sidecar_of(account: str, instance_id: str, **ids: str) -> Any:
    t = grafana()
    return collector_config(
        [Named(t, f"12345:{KEY}", frozenset(Kind))],
        workload_attributes(account, instance_id, **ids),
    )


def pod_spec(server: FakeKubernetes, kind: str, namespace: str, name: str) -> dict[str, Any]:
    obj = server.get(kind, namespace, name)
    assert obj is not None
    spec: dict[str, Any] = obj["spec"]["template"]["spec"]
    return spec


def secret_data(server: FakeKubernetes, namespace: str) -> dict[str, str]:
    secret = server.get("Secret", namespace, KEYS_SECRET)
    assert secret is not None
    if "stringData" in secret:
        return dict(secret["stringData"])
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


async def test_a_function_pod_gets_the_collector_its_config_and_its_keys_in_a_secret(
    server: FakeKubernetes, adapter: KubernetesAdapter
) -> None:
    plain = instance()
    sidecar = sidecar_of("nca-1", plain.instance_id, function_id="fn-1", version_id="ver-1")
    inst = dataclasses.replace(plain, telemetry=sidecar)

    await adapter.apply(inst, install(inst))

    ns = inst.namespace
    spec = pod_spec(server, "Deployment", ns, "web")
    names = [c["name"] for c in spec["containers"]]
    assert names == ["inference", CONTAINER_NAME]
    assert CONTAINER_NAME not in [c["name"] for c in spec.get("initContainers", [])]
    collector = spec["containers"][-1]
    assert collector["image"] == IMAGE
    # never a readiness gate, never restarted for being slow
    assert not {"readinessProbe", "livenessProbe", "startupProbe"} & set(collector)
    assert collector["resources"]["limits"] == {"cpu": "500m", "memory": "256Mi"}
    env = {e["name"]: e for e in collector["env"]}
    assert {n: env[n]["valueFrom"]["fieldRef"]["fieldPath"] for n in POD_ENV} == dict(POD_ENV)
    keyed = {n: e["valueFrom"]["secretKeyRef"] for n, e in env.items() if n not in POD_ENV}
    assert keyed == {
        "NVCF_TELEMETRY_0_USER": {"name": KEYS_SECRET, "key": "NVCF_TELEMETRY_0_USER"},
        "NVCF_TELEMETRY_0_PASSWORD": {"name": KEYS_SECRET, "key": "NVCF_TELEMETRY_0_PASSWORD"},
    }
    assert all("value" not in e for e in collector["env"])  # never a plain env value
    mounts = {m["name"]: m for m in collector["volumeMounts"]}
    logs = mounts["nvcf-otelcol-pod-logs"]
    assert logs["readOnly"] is True
    assert logs["subPathExpr"] == "$(POD_NAMESPACE)_$(POD_NAME)_$(POD_UID)"
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["nvcf-otelcol-pod-logs"]["hostPath"]["path"] == "/var/log/pods"
    assert volumes["nvcf-otelcol-config"]["configMap"] == {"name": CONFIG_MAP}
    assert mounts["nvcf-otelcol-state"]["mountPath"] == "/var/lib/nvcf-otelcol"
    assert "emptyDir" in volumes["nvcf-otelcol-state"]

    config_map = server.get("ConfigMap", ns, CONFIG_MAP)
    assert config_map is not None
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    otelcol.validate(config, set(keyed) | set(POD_ENV))
    exporter = config["exporters"][f"otlp_http/{uuid.UUID(int=7)}"]
    assert exporter["endpoint"] == "https://otlp-gateway.grafana.net/otlp"
    assert KEY not in config_map["data"]["config.yaml"]
    assert secret_data(server, ns) == {
        "NVCF_TELEMETRY_0_USER": "12345",
        "NVCF_TELEMETRY_0_PASSWORD": KEY,
    }
    namespace = server.get("Namespace", None, ns)
    assert namespace is not None
    recorded = json.loads(namespace["metadata"]["annotations"][APPLIED_ANNOTATION])
    assert ["v1", "ConfigMap", CONFIG_MAP] in recorded
    assert ["v1", "Secret", KEYS_SECRET] in recorded
    assert KEY not in repr(inst)

    # applied again (an instance the cluster forgot): the same pod, one collector
    await adapter.apply(inst, install(inst))
    spec = pod_spec(server, "Deployment", ns, "web")
    assert [c["name"] for c in spec["containers"]].count(CONTAINER_NAME) == 1

    # deletion removes the namespace, and the Secret with it
    while not await adapter.delete(inst):
        pass
    assert server.get("Secret", ns, KEYS_SECRET) is None
    assert server.objects(ns) == []


async def test_a_task_job_gets_the_collector_as_a_native_sidecar(
    server: FakeKubernetes, adapter: KubernetesAdapter
) -> None:
    plain = task_instance()
    inst = dataclasses.replace(plain, telemetry=sidecar_of("nca-1", plain.instance_id))

    await adapter.apply(inst, task_objects())

    spec = pod_spec(server, "Job", inst.namespace, JOB)
    init = {c["name"]: c for c in spec["initContainers"]}
    # a native sidecar: the Job completes when the task container exits
    assert init[CONTAINER_NAME]["restartPolicy"] == "Always"
    assert UTILS_CONTAINER in init
    assert CONTAINER_NAME not in [c["name"] for c in spec["containers"]]
    config_map = server.get("ConfigMap", inst.namespace, CONFIG_MAP)
    assert config_map is not None
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    actions = {a["key"]: a["value"] for a in config["processors"]["resource"]["attributes"]}
    assert actions["nvcf.task.id"] == plain.instance_id
    assert "nvcf.function.id" not in actions


async def test_a_workload_naming_no_telemetry_gets_no_collector(
    server: FakeKubernetes, adapter: KubernetesAdapter
) -> None:
    inst = instance()
    await adapter.apply(inst, install(inst))
    spec = pod_spec(server, "Deployment", inst.namespace, "web")
    assert CONTAINER_NAME not in [c["name"] for c in spec["containers"]]
    assert server.get("Secret", inst.namespace, KEYS_SECRET) is None
    assert server.get("ConfigMap", inst.namespace, CONFIG_MAP) is None


def test_a_charts_bare_pod_and_cronjob_get_the_collector_too() -> None:
    pod_spec = {"containers": [{"name": "main", "image": "nvcr.io/acme/a:1"}]}
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": pod_spec},
        {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": {"name": "c"},
            "spec": {"jobTemplate": {"spec": {"template": {"spec": dict(pod_spec)}}}},
        },
    ]
    assert inject(objects, sidecar_of("nca-1", "inst-1"), CollectorPod(IMAGE))

    pod, cron = objects[0]["spec"], objects[1]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["main", CONTAINER_NAME]
    assert [c["name"] for c in cron["initContainers"]] == [CONTAINER_NAME]
    assert cron["initContainers"][0]["restartPolicy"] == "Always"
    assert [o["kind"] for o in objects[2:]] == ["ConfigMap", "Secret"]


def test_a_new_key_changes_a_deployments_pod_template_and_never_a_jobs() -> None:
    def applied(key: str, kind: str) -> dict[str, Any]:
        template = {"spec": {"containers": [{"name": "main", "image": "nvcr.io/acme/a:1"}]}}
        obj: dict[str, Any] = {"apiVersion": "v1", "kind": kind, "metadata": {"name": "w"}}
        obj["spec"] = {"template": template}
        sidecar = collector_config(
            [Named(grafana(), f"12345:{key}", frozenset(Kind))],
            workload_attributes("nca-1", "inst-1"),
        )
        assert sidecar is not None
        objects: list[dict[str, Any]] = [obj]
        assert inject(objects, sidecar, CollectorPod(IMAGE))
        return dict(obj["spec"]["template"])

    old, again, new = (applied(k, "Deployment") for k in (KEY, KEY, "rotated-key"))
    checksum = old["metadata"]["annotations"][KEYS_CHECKSUM]
    assert again["metadata"]["annotations"][KEYS_CHECKSUM] == checksum  # same keys: no roll
    assert new["metadata"]["annotations"][KEYS_CHECKSUM] != checksum  # a new key rolls the pods
    assert KEY not in json.dumps(old) and "rotated-key" not in json.dumps(new)
    # a Job's pod template cannot change: its running pod keeps the key it started with
    assert "metadata" not in applied("rotated-key", "Job")
