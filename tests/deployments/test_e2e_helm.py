"""Helm functions end to end through the HTTP API on the simulated clusters.

A helm function is created from the `sim-workload` corpus chart in a real local registry, then
deployed with `configuration` overrides that steer the simulated pods (fault annotations), the
health mode (the chart's `nvcf-workload-config`) and what the backend receives. Everything is
observed the way a user would — GET deployment, function status, deployment events — plus the
objects the simulated cluster holds in the instance namespace `sr-<instanceId>`.

The catalog is the built-in one (same groups, clusters, shapes and attributes) with near-zero
simulation delays; health timeouts are shrunk. Waits poll with a deadline.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from service.backends.protocol import InstanceSpec
from service.backends.simulated.adapter import SimulatedAdapter
from service.deployments.models import Instance
from service.registry.pull_secrets import pull_secret_name
from tests.support.app import AppClient, ClientFactory
from tests.support.charts import PushCorpus
from tests.support.e2e import V, dep_url, deployment, eventually, status, until_status
from tests.support.helm_e2e import (
    FAULT,
    deploy,
    events,
    pod_faults,
    setup,
    spec,
)
from tests.support.nvcf_cli import add_request
from tests.support.registry import RegistryServer

pytestmark = pytest.mark.registry

NVLINK_INDEX = "dra.nvcf.nvidia.io/required-nvlink-domain-index"
PARTITION = "dra.nvcf.nvidia.io/nvlink-domain-partition"
CLIQUE = "nvidia.com/gpu.clique"


async def running_instance(client: AppClient, fn: dict[str, Any]) -> dict[str, Any]:
    """The single instance of an ACTIVE deployment (Running)."""
    dep = await deployment(client, fn)
    assert dep["functionStatus"] == "ACTIVE", dep
    [inst] = dep["instances"]
    assert inst["phase"] == "Running", inst
    return dict(inst)


def sim(client: AppClient, cluster: str) -> SimulatedAdapter:
    adapter = client.app.state.adapters.get(cluster)
    assert isinstance(adapter, SimulatedAdapter)
    return adapter


async def backend_objects(
    client: AppClient, cluster: str, instance_id: str
) -> list[dict[str, Any]]:
    """What the simulated cluster holds in namespace `sr-<instanceId>` (`kubectl get -o json`)."""
    target = InstanceSpec(instance_id, "", "", "", "", 1)
    return await sim(client, cluster).objects(target)


def named(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [obj] = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


def pods_of(objects: list[dict[str, Any]], component: str) -> list[dict[str, Any]]:
    return [
        o
        for o in objects
        if o["kind"] == "Pod"
        and o["metadata"]["labels"].get("app.kubernetes.io/component") == component
    ]


def env_of(container: dict[str, Any]) -> dict[str, str]:
    entries = container.get("env") or []
    as_dict = {e["name"]: e.get("value") for e in entries}
    assert len(as_dict) == len(entries), f"duplicate env names: {entries}"
    return as_dict


async def stored_condition(client: AppClient, instance_id: str) -> dict[str, Any]:
    """The health condition the reconciler stored for an instance (not exposed by the API)."""
    async with client.app.state.sessionmaker() as session:
        row = await session.get(Instance, uuid.UUID(instance_id))
    assert row is not None
    return dict(row.condition or {})


def partition(namespace: str, index: str = "") -> str:
    return "x" + hashlib.sha256((namespace + index).encode()).hexdigest()[:18] + "x"


# --- 1. fault annotations through `configuration` -------------------------------------------


async def test_fault_annotations_end_deploying_versions_in_error_with_documented_reasons(
    client_factory: ClientFactory,
    tmp_path: Path,
    anon_registry: RegistryServer,
    push_corpus: PushCorpus,
) -> None:
    cases: dict[str, tuple[dict[str, Any], str, str]] = {
        # name: (configuration, reason, a piece of the message the user sees)
        "pull": (
            pod_faults("ImagePullBackOff"),
            "ImagePullIssues",
            "cannot pull image nvcr.io/acme/sim-worker:1.0",
        ),
        "unschedulable": (
            pod_faults("Unschedulable"),
            "PodStuckScheduling",
            "didn't match Pod's node affinity/selector",
        ),
        # more GPUs than any H100 node has (8): the scheduler never finds room
        "too-many-gpus": ({"gpus": 16}, "PodStuckScheduling", "Insufficient nvidia.com/gpu"),
        "crash": (
            pod_faults("CrashLoopBackOff"),
            "ContainersInRestartLoop",
            "looping for more than",
        ),
        "never-ready": (
            pod_faults("NeverReady"),
            "WorkerStartupTimeout",
            "did not become ready within 4s",
        ),
    }
    client, fns = await setup(
        client_factory, tmp_path, anon_registry, push_corpus, functions=len(cases)
    )
    by_case = dict(zip(cases, fns, strict=True))
    for name, fn in by_case.items():
        await deploy(client, fn, spec(cases[name][0]))
    for fn in by_case.values():
        await until_status(client, fn, "ERROR")

    for name, fn in by_case.items():
        _, reason, message_part = cases[name]
        dep = await deployment(client, fn)
        assert dep["functionStatus"] == "ERROR", name
        assert dep["instances"] == [], name  # the failed instance is torn down, not retried
        [health] = dep["healthInfo"]
        assert (health["gpu"], health["instanceType"], health["backend"]) == (
            "H100",
            "NCP.GPU.H100_1x",
            "nvcf-default",
        ), name
        assert health["error"].startswith(f"{reason}: "), (name, health)
        assert message_part in health["error"], (name, health)

        timeline = await events(client, dep)
        failed = [e for e in timeline if e["kind"] == "instance" and e.get("phase") == "Failed"]
        assert [e["reason"] for e in failed] == [reason], (name, timeline)
        statuses = [e for e in timeline if e["kind"] == "status"]
        assert statuses[-1]["message"].startswith("function version status DEPLOYING → ERROR")
        assert statuses[-1]["reason"] == reason, name

        # nothing is left in the simulated cluster for the failed instance
        instance_id = failed[0]["instanceId"]

        async def torn_down(iid: str = instance_id) -> bool:
            return not await backend_objects(client, "sim-ncp", iid)

        await eventually(torn_down)


# --- FailAfterReady: degraded, replaced by a new instance, ACTIVE again ----------------------


async def test_fail_after_ready_degrades_then_a_new_instance_makes_it_active_again(
    client_factory: ClientFactory,
    tmp_path: Path,
    anon_registry: RegistryServer,
    push_corpus: PushCorpus,
) -> None:
    client, [fn] = await setup(client_factory, tmp_path, anon_registry, push_corpus)
    faults = pod_faults("FailAfterReady", **{"sim.nvcf.io/fail-after": "2s"})
    dep = await deploy(client, fn, spec(faults))
    await until_status(client, fn, "ACTIVE")
    first = await running_instance(client, fn)

    async def replaced_and_active() -> dict[str, Any] | None:
        current = await deployment(client, fn)
        if current["functionStatus"] != "ACTIVE":
            return None
        [inst] = current["instances"]
        ok = inst["instanceId"] != first["instanceId"] and inst["phase"] == "Running"
        return dict(inst) if ok else None

    second = await eventually(replaced_and_active)
    assert second["cluster"] == "sim-ncp"

    timeline = await events(client, dep)
    mine = [e for e in timeline if e.get("instanceId") == first["instanceId"]]
    phases = [(e["phase"], e["reason"]) for e in mine if e["kind"] == "instance"]
    # Running, then not ready (degraded), then failed after the degradation period
    assert ("Running", "Ready") in phases, phases
    assert ("Degraded", "WorkerDegraded") in phases, phases
    assert phases[-1] == ("Failed", "WorkerDegraded"), phases
    transitions = [e["message"] for e in timeline if e["kind"] == "status"]
    expected = [
        "function version status INACTIVE → DEPLOYING",
        "function version status DEPLOYING → ACTIVE",
        "function version status ACTIVE → DEGRADED",
        "function version status DEGRADED → ACTIVE",
    ]
    assert transitions[: len(expected)] == expected, transitions
    # the failed instance is gone from the cluster
    assert await backend_objects(client, "sim-ncp", first["instanceId"]) == []


# --- 2. StatusByWorkerReadiness --------------------------------------------------------------


async def test_worker_readiness_mode_ignores_a_failing_side_job_but_not_a_failing_worker(
    client_factory: ClientFactory,
    tmp_path: Path,
    anon_registry: RegistryServer,
    push_corpus: PushCorpus,
) -> None:
    client, [lenient, strict, broken] = await setup(
        client_factory,
        tmp_path,
        anon_registry,
        push_corpus,
        functions=3,
        health_worker_startup_timeout=1.0,
    )
    failing_job = {"enabled": True, "podAnnotations": {FAULT: "CrashLoopBackOff"}}
    worker_mode = {"enabled": True, "statusByWorkerReadiness": True}
    await deploy(client, lenient, spec({"sideJob": failing_job, "workloadConfig": worker_mode}))
    # the same failing Job without the workload config: every object counts
    strict_dep = await deploy(client, strict, spec({"sideJob": failing_job}))
    # worker mode, but the worker itself never becomes ready
    await deploy(client, broken, spec({**pod_faults("NeverReady"), "workloadConfig": worker_mode}))

    await until_status(client, strict, "ERROR")
    await until_status(client, broken, "ERROR")
    await until_status(client, lenient, "ACTIVE")

    # default mode: the failed Job fails the instance at once (judged through the Job, whose
    # backoffLimit decides, not through its failed pod)
    dep = await deployment(client, strict)
    [health] = dep["healthInfo"]
    assert health["error"].startswith("JobFailed: Job mini-service-side failed"), health
    assert any(
        e["kind"] == "status"
        and e.get("reason") == "JobFailed"
        and e["message"].startswith("function version status DEPLOYING → ERROR")
        for e in await events(client, strict_dep)
    )

    # worker mode: the worker never became ready → the startup timeout still fails it
    dep = await deployment(client, broken)
    [health] = dep["healthInfo"]
    assert health["error"].startswith(
        "WorkerStartupTimeout: the inference worker did not become ready within 1s"
    ), health

    # worker mode with a failed side Job: ACTIVE, and it stays so once the Job has failed
    inst = await running_instance(client, lenient)
    assert (inst["reason"], inst["message"]) == ("WorkerReady", "the inference worker is ready")

    async def job_failed() -> bool:
        objects = await backend_objects(client, "sim-ncp", inst["instanceId"])
        job = named(objects, "Job", "mini-service-side")
        conditions = {c["type"]: c["status"] for c in job["status"].get("conditions", [])}
        return conditions.get("Failed") == "True"

    await eventually(job_failed)

    async def failure_evaluated() -> bool:
        # the reconciler has looked at the failed Job (kept as a note of the instance's health)
        notes = (await stored_condition(client, inst["instanceId"])).get("observations") or []
        return any(n["object"] == "Job/mini-service-side" for n in notes)

    await eventually(failure_evaluated)
    again = await running_instance(client, lenient)
    assert again["instanceId"] == inst["instanceId"]
    assert await status(client, lenient) == "ACTIVE"


async def test_worker_readiness_mode_records_side_object_failures_as_events(
    client_factory: ClientFactory,
    tmp_path: Path,
    anon_registry: RegistryServer,
    push_corpus: PushCorpus,
) -> None:
    client, [fn] = await setup(client_factory, tmp_path, anon_registry, push_corpus)
    configuration = {
        "sideJob": {"enabled": True, "podAnnotations": {FAULT: "CrashLoopBackOff"}},
        "workloadConfig": {"enabled": True},
    }
    dep = await deploy(client, fn, spec(configuration))
    await until_status(client, fn, "ACTIVE")
    inst = await running_instance(client, fn)

    async def failure_evaluated() -> bool:
        notes = (await stored_condition(client, inst["instanceId"])).get("observations") or []
        return any(n["object"] == "Job/mini-service-side" for n in notes)

    await eventually(failure_evaluated)
    assert await status(client, fn) == "ACTIVE"
    timeline = await events(client, dep)
    assert any("mini-service-side" in e["message"] for e in timeline), timeline


# --- 3. configuration overrides reach the backend; rule-breaking ones are refused ----------


async def test_configuration_overrides_change_what_the_backend_receives(
    client_factory: ClientFactory,
    tmp_path: Path,
    anon_registry: RegistryServer,
    push_corpus: PushCorpus,
) -> None:
    client, [fn] = await setup(client_factory, tmp_path, anon_registry, push_corpus)

    # an override that breaks a restriction: refused at deploy time with the rule id
    resp = await client.post(
        dep_url(fn),
        json={"deploymentSpecifications": [spec({"service": {"type": "NodePort"}})]},
    )
    assert resp.status_code == 400, resp.text
    problem = resp.json()
    assert [(e["field"], e["rule"], e["object"]) for e in problem["errors"]] == [
        ("deploymentSpecifications[0].configuration", "service-type", "v1/Service/entrypoint")
    ]
    assert "NodePort" in problem["errors"][0]["message"]
    assert await status(client, fn) == "INACTIVE"
    assert (await client.get(dep_url(fn))).status_code == 404

    sidecar = {
        "name": "metrics",
        "image": "nvcr.io/acme/metrics:3.1",
        "resources": {"limits": {"cpu": "100m", "memory": "64Mi"}},
    }
    configuration = {
        "replicaCount": 2,
        "image": {"tag": "2.0"},  # maps deep-merge: the repository keeps its default
        "env": [{"name": "MODEL_NAME", "value": "llama"}, {"name": "LOG_LEVEL", "value": "debug"}],
        "extraContainers": [sidecar],
        "gpus": 2,
        "deploymentAnnotations": {"team.example.com/owner": "ml-platform"},
    }
    dep = await deploy(client, fn, spec(configuration, instanceType="NCP.GPU.H100_4x"))
    assert dep["deploymentSpecifications"][0]["configuration"] == configuration
    await until_status(client, fn, "ACTIVE")
    inst = await running_instance(client, fn)
    assert inst["cluster"] == "sim-ncp"

    objects = await backend_objects(client, "sim-ncp", inst["instanceId"])
    worker = named(objects, "Deployment", "mini-service-worker")
    assert worker["metadata"]["namespace"] == f"sr-{inst['instanceId']}"
    assert worker["metadata"]["annotations"]["team.example.com/owner"] == "ml-platform"
    assert worker["spec"]["replicas"] == 2
    containers = worker["spec"]["template"]["spec"]["containers"]
    assert [(c["name"], c["image"]) for c in containers] == [
        ("worker", "nvcr.io/acme/sim-worker:2.0"),
        ("metrics", "nvcr.io/acme/metrics:3.1"),
    ]
    assert containers[0]["resources"]["limits"]["nvidia.com/gpu"] == 2
    env = env_of(containers[0])
    assert (env["MODEL_NAME"], env["LOG_LEVEL"]) == ("llama", "debug")
    # the list replaced the chart's env list (Helm coalescing: lists replace) …
    assert env["NVCF_REGION"] == "us-east-1"
    # … and no side Job / workload config was asked for
    assert not [o for o in objects if o["kind"] in ("Job", "ConfigMap")]
    pods = pods_of(objects, "worker")
    assert len(pods) == 2
    assert all(p["status"]["phase"] == "Running" for p in pods)
    assert all(p["spec"]["nodeName"].startswith("sim-ncp-h100-8x-") for p in pods)
    assert {c["name"] for p in pods for c in p["spec"]["containers"]} == {"worker", "metrics"}


# --- 4. install-time mutations as received by the backend; 5. undeploy --------------------


async def test_install_time_mutations_as_received_by_the_backend_then_undeploy(
    client_factory: ClientFactory,
    tmp_path: Path,
    anon_registry: RegistryServer,
    push_corpus: PushCorpus,
) -> None:
    client, [fn] = await setup(client_factory, tmp_path, anon_registry, push_corpus)
    credentials = {
        "nvcr.io": ("$oauthtoken", "nvapi-" + "k" * 40),
        "registry.example.com": ("robot-puller", "robot-Pa55word"),
    }
    artifact_types = {"nvcr.io": ["CONTAINER"], "registry.example.com": ["HELM", "CONTAINER"]}
    # a HELM-only credential pulls charts but is never given to a Pod
    helm_only = add_request("charts.example.com", "chart-puller", "chart-Pa55word", ["HELM"])
    for body in [
        *(add_request(h, u, p, artifact_types[h]) for h, (u, p) in credentials.items()),
        helm_only,
    ]:
        resp = await client.post(f"{V}/registry-credentials", json=body)
        assert resp.status_code == 200, resp.text
        assert "Pa55word" not in resp.text and "nvapi-" not in resp.text
    nvcr_secret = pull_secret_name("nvcr.io", "$oauthtoken")
    # the chart's own pull secrets, one of them repeated and one named like a generated one
    chart_secrets = [
        {"name": "zz-chart-pull"},
        {"name": nvcr_secret},
        {"name": "chart-pull"},
        {"name": "chart-pull"},
    ]
    configuration = {
        "imagePullSecrets": chart_secrets,
        "extraContainers": [{"name": "sidecar", "image": "nvcr.io/acme/sidecar:1.0"}],
    }
    dep = await deploy(client, fn, spec(configuration, instanceType="NCP.GPU.H100_2x", gpu="h100"))
    await until_status(client, fn, "ACTIVE")
    inst = await running_instance(client, fn)
    instance_id = inst["instanceId"]
    namespace = f"sr-{instance_id}"
    objects = await backend_objects(client, "sim-ncp", instance_id)

    # one dockerconfigjson Secret per CONTAINER credential, decoding to its registry and user
    secrets = {
        o["metadata"]["name"]: o
        for o in objects
        if o["kind"] == "Secret" and o["metadata"]["name"] != "nvcf-secrets"
    }
    assert {s["type"] for s in secrets.values()} == {"kubernetes.io/dockerconfigjson"}
    # the version's secrets (none here): an Opaque Secret of secrets.json
    [own] = [
        o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"] == "nvcf-secrets"
    ]
    assert own["type"] == "Opaque"
    assert json.loads(base64.b64decode(own["data"]["secrets.json"])) == {}
    generated: dict[str, str] = {}
    for name, secret in secrets.items():
        config = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))
        [(host, auth)] = config["auths"].items()
        user, password = credentials[host]
        assert auth["username"] == user
        right_password = hmac.compare_digest(auth["password"], password)
        right_auth = hmac.compare_digest(
            base64.b64decode(auth["auth"]).decode(), f"{user}:{password}"
        )
        assert right_password and right_auth, f"wrong credential in Secret {name}"
        generated[host] = name
    assert sorted(generated) == sorted(credentials)  # not charts.example.com (HELM only)
    assert generated["nvcr.io"] == nvcr_secret
    assert pull_secret_name("charts.example.com", "chart-puller") not in secrets

    worker = named(objects, "Deployment", "mini-service-worker")
    pod_spec = worker["spec"]["template"]["spec"]
    # pull secrets: chart's ∪ generated, de-duplicated and sorted by name
    expected_names = sorted({"zz-chart-pull", "chart-pull", *generated.values()})
    assert pod_spec["imagePullSecrets"] == [{"name": n} for n in expected_names]

    # NVCF_* env on every container, replacing the chart's same-named entry
    nca_id = fn["ncaId"]
    nvcf_env = {
        "NVCF_FUNCTION_ID": fn["id"],
        "NVCF_FUNCTION_VERSION_ID": fn["versionId"],
        "NVCF_FUNCTION_NAME": fn["name"],
        "NVCF_NCA_ID": nca_id,
        "NVCF_INSTANCETYPE": "NCP.GPU.H100_2x",
        "NVCF_BACKEND": "nvcf-default",
        "NVCF_REGION": "us-east-1",
    }
    worker_env, sidecar_env = (env_of(c) for c in pod_spec["containers"])
    assert worker_env == {"MODEL_NAME": "sim", **nvcf_env}
    assert sidecar_env == nvcf_env
    # the secrets mounted read-only at /var/secrets in every container of the chart's pods
    assert {"name": "nvcf-secrets", "secret": {"secretName": "nvcf-secrets"}} in pod_spec["volumes"]
    mount = {"name": "nvcf-secrets", "mountPath": "/var/secrets", "readOnly": True}
    assert all(mount in c["volumeMounts"] for c in pod_spec["containers"])

    # required node affinity on the instance type without its `_<N>x` suffix
    terms = pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert [t["matchExpressions"] for t in terms["nodeSelectorTerms"]] == [
        [{"key": "nvca.nvcf.nvidia.io/instance-type", "operator": "In", "values": ["NCP.GPU.H100"]}]
    ]
    # not an NVLinkOptimized cluster: no ComputeDomain, no pod affinity, no claims
    assert not [o for o in objects if o["kind"] == "ComputeDomain"]
    assert "podAffinity" not in pod_spec["affinity"]
    assert "resourceClaims" not in pod_spec

    # labels and annotations of §5 on every object handed over
    handed = [o for o in objects if o["kind"] not in ("Pod", "ReplicaSet")]
    assert sorted(f"{o['kind']}/{o['metadata']['name']}" for o in handed) == sorted(
        [f"Secret/{n}" for n in generated.values()]
        + ["Secret/nvcf-secrets", "Deployment/mini-service-worker", "Service/entrypoint"]
    )
    for obj in handed:
        meta = obj["metadata"]
        assert meta["namespace"] == namespace
        assert {k: v for k, v in meta["labels"].items() if k.startswith("nvcf.nvidia.com/")} == {
            "nvcf.nvidia.com/function-id": fn["id"],
            "nvcf.nvidia.com/function-version-id": fn["versionId"],
            "nvcf.nvidia.com/instance-id": instance_id,
            "nvcf.nvidia.com/nca-id": nca_id,
        }
        assert {
            k: v for k, v in meta["annotations"].items() if k.startswith("nvcf.nvidia.com/")
        } == {
            "nvcf.nvidia.com/function-name": fn["name"],
            "nvcf.nvidia.com/instance-type": "NCP.GPU.H100_2x",
            "nvcf.nvidia.com/backend": "nvcf-default",
            "nvcf.nvidia.com/region": "us-east-1",
        }
    [pod] = pods_of(objects, "worker")
    assert pod["metadata"]["labels"]["nvcf.nvidia.com/instance-id"] == instance_id
    assert pod["spec"]["imagePullSecrets"] == pod_spec["imagePullSecrets"]

    # 5. undeploy → INACTIVE, nothing left in the simulated cluster
    resp = await client.delete(dep_url(fn))
    assert resp.status_code == 200, resp.text
    assert resp.json()["function"]["status"] == "INACTIVE"
    await until_status(client, fn, "INACTIVE")

    assert (await client.get(dep_url(fn))).status_code == 404

    async def torn_down() -> bool:  # the backend teardown runs in the reconciler
        return not await backend_objects(client, "sim-ncp", instance_id)

    await eventually(torn_down)

    async def records_gone() -> bool:
        # removed: only its history answers now (removedAt), no instance is left
        resp = await client.get(f"{V}/deployments/{dep['deploymentId']}")
        got = resp.json().get("deployment", {}) if resp.status_code == 200 else {}
        return "removedAt" in got and got["instances"] == []

    await eventually(records_gone)
    assert await status(client, fn) == "INACTIVE"


# --- 4. NVLinkOptimized cluster (sim-onprem, B200) ------------------------------------------


async def test_nvlink_optimized_cluster_mutations_as_received_by_the_backend(
    client_factory: ClientFactory,
    tmp_path: Path,
    anon_registry: RegistryServer,
    push_corpus: PushCorpus,
) -> None:
    client, [fn] = await setup(client_factory, tmp_path, anon_registry, push_corpus)
    configuration = {
        "gpus": 8,
        # on the Deployment's own metadata only: must have no effect
        "deploymentAnnotations": {NVLINK_INDEX: "0"},
        "extraContainers": [{"name": "sidecar", "image": "nvcr.io/acme/sidecar:1.0"}],
        # on the side Job's pod template: required pod affinity
        "sideJob": {"enabled": True, "podAnnotations": {NVLINK_INDEX: "1"}},
    }
    b200 = {"gpu": "B200", "instanceType": "ON-PREM.GPU.B200_8x"}
    await deploy(client, fn, spec(configuration, **b200))
    await until_status(client, fn, "ACTIVE")
    inst = await running_instance(client, fn)
    assert inst["cluster"] == "sim-onprem"
    namespace = f"sr-{inst['instanceId']}"
    objects = await backend_objects(client, "sim-onprem", inst["instanceId"])

    domain = named(objects, "ComputeDomain", "nvcf-cd-index-0")
    assert domain["apiVersion"] == "resource.nvidia.com/v1beta1"
    assert domain["metadata"]["namespace"] == namespace
    assert domain["spec"]["channel"] == {"resourceClaimTemplate": {"name": "nvcf-cd-channel-0"}}

    def affinity_term(label: str) -> dict[str, Any]:
        return {
            "labelSelector": {
                "matchExpressions": [{"key": PARTITION, "operator": "In", "values": [label]}]
            },
            "topologyKey": CLIQUE,
        }

    node_term = [
        {
            "key": "nvca.nvcf.nvidia.io/instance-type",
            "operator": "In",
            "values": ["ON-PREM.GPU.B200"],
        },
        {"key": CLIQUE, "operator": "Exists"},
    ]

    # the worker: index annotation only on the controller → as if absent → preferred
    worker = named(objects, "Deployment", "mini-service-worker")
    assert worker["metadata"]["annotations"][NVLINK_INDEX] == "0"
    template = worker["spec"]["template"]
    assert NVLINK_INDEX not in (template["metadata"].get("annotations") or {})
    unindexed = partition(namespace)
    assert template["metadata"]["labels"][PARTITION] == unindexed
    affinity = template["spec"]["affinity"]
    assert affinity["podAffinity"] == {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "podAffinityTerm": affinity_term(unindexed)}
        ]
    }
    node_terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert [t["matchExpressions"] for t in node_terms["nodeSelectorTerms"]] == [node_term]
    # the GPU container gets the claim, the sidecar does not
    worker_c, sidecar_c = template["spec"]["containers"]
    assert worker_c["resources"]["claims"] == [{"name": "nvcf-cd-index-0"}]
    assert worker_c["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert "claims" not in (sidecar_c.get("resources") or {})
    assert template["spec"]["resourceClaims"] == [
        {"name": "nvcf-cd-index-0", "resourceClaimTemplateName": "nvcf-cd-channel-0"}
    ]

    # the side Job: index annotation on its pod template → required, its own partition
    job = named(objects, "Job", "mini-service-side")
    job_template = job["spec"]["template"]
    indexed = partition(namespace, "1")
    assert indexed != unindexed
    assert job_template["metadata"]["labels"][PARTITION] == indexed
    job_affinity = job_template["spec"]["affinity"]
    assert job_affinity["podAffinity"] == {
        "requiredDuringSchedulingIgnoredDuringExecution": [affinity_term(indexed)]
    }
    # no GPUs requested: no claim on the container, no resourceClaims on the pod
    [job_c] = job_template["spec"]["containers"]
    assert "claims" not in job_c["resources"]
    assert "resourceClaims" not in job_template["spec"]

    # the pods the cluster created carry the partition labels and landed on a B200 clique node
    [worker_pod] = pods_of(objects, "worker")
    assert worker_pod["metadata"]["labels"][PARTITION] == unindexed
    assert worker_pod["spec"]["nodeName"].startswith("sim-onprem-b200-8x-")
    [job_pod] = pods_of(objects, "side-job")
    assert job_pod["metadata"]["labels"][PARTITION] == indexed
