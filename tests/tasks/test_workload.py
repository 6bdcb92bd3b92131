"""A container task's objects: a Job that runs once with NVCT's contract in its container,
and the Secret of its secrets."""

from __future__ import annotations

import base64
import json
from typing import Any

from service.clusters.catalog import Catalog
from service.clusters.instance_types import parse_instance_type
from service.tasks.workload import helm_objects, job_objects


def test_job_and_secret_of_a_container_task() -> None:
    catalog = Catalog.from_data(
        {
            "clusterGroups": [
                {
                    "name": "g",
                    "clusters": [
                        {
                            "name": "sim-a",
                            "adapter": "simulated",
                            "provider": "NCP",
                            "region": "r",
                            "nodes": [{"gpu": "H100", "gpusPerNode": 8, "count": 1}],
                        }
                    ],
                }
            ]
        }
    )
    cluster = catalog.cluster("sim-a")
    assert cluster is not None
    secret, job = job_objects(
        task_id="t-1",
        name="train",
        nca_id="acme",
        image="nvcr.io/acme/trainer:1.0",
        args="--epochs '2 3'",
        environment=[{"key": "MODEL", "value": "llama"}, {"key": "NVCT_TASK_ID", "value": "x"}],
        cluster=cluster,
        backend="g",
        instance_type=parse_instance_type("NCP.GPU.H100_2x"),
        max_runtime_seconds=5400.0,
        grace_seconds=900.0,
        secrets={"HF_TOKEN": "v"},
    )
    assert secret["kind"] == "Secret"
    assert json.loads(base64.b64decode(secret["data"]["secrets.json"])) == {"HF_TOKEN": "v"}
    assert (job["apiVersion"], job["kind"]) == ("batch/v1", "Job")
    spec = job["spec"]
    assert spec["backoffLimit"] == 0 and spec["activeDeadlineSeconds"] == 5400
    assert spec["suspend"] is False
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["terminationGracePeriodSeconds"] == 900
    [container] = pod["containers"]
    assert container["args"] == ["--epochs", "2 3"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["MODEL"] == "llama" and env["NVCT_TASK_ID"] == "t-1"  # NVCT's names win
    assert env["NVCT_TASK_NAME"] == "train" and env["NVCT_NCA_ID"] == "acme"
    assert env["NVCT_PROGRESS_FILE_PATH"].startswith("/var/nvct/")
    assert env["NVCT_RESULTS_DIR"].startswith("/var/nvct/")
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/var/secrets", "/config/models", "/config/resources", "/var/nvct"} <= mounts


def test_a_container_tasks_pod_gets_a_functions_install_mutations() -> None:
    """Node affinity on the instance type's node label and the account's pull Secrets, as a
    function's pods get them."""
    catalog = Catalog.from_data(
        {
            "clusterGroups": [
                {
                    "name": "g",
                    "clusters": [
                        {
                            "name": "sim-a",
                            "adapter": "simulated",
                            "provider": "NCP",
                            "region": "r",
                            "nodes": [{"gpu": "H100", "gpusPerNode": 8, "count": 1}],
                        }
                    ],
                }
            ]
        }
    )
    cluster = catalog.cluster("sim-a")
    assert cluster is not None
    pull = [("nvcf-pull-0123", {"auths": {"nvcr.io": {"username": "u", "password": "p"}}})]
    *generated, job = job_objects(
        task_id="t-1",
        name="train",
        nca_id="acme",
        image="nvcr.io/acme/trainer:1.0",
        args=None,
        environment=None,
        cluster=cluster,
        backend="g",
        instance_type=parse_instance_type("NCP.GPU.H100_2x"),
        max_runtime_seconds=None,
        grace_seconds=60.0,
        secrets={},
        pull_secrets=pull,
    )
    kinds = {(o["kind"], o["metadata"]["name"], o.get("type")) for o in generated}
    assert ("Secret", "nvcf-pull-0123", "kubernetes.io/dockerconfigjson") in kinds
    pod = job["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "nvcf-pull-0123"}]
    [term] = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert {
        "key": "nvca.nvcf.nvidia.io/instance-type",
        "operator": "In",
        "values": ["NCP.GPU.H100"],
    } in term["matchExpressions"]


def test_a_helm_tasks_pods_get_the_tasks_grace_period_and_its_jobs_suspend() -> None:
    """Deleting a helm task's pods kills them only after the task's grace period; suspended,
    its Jobs ask their pods to stop as a container task's Job does."""
    chart = [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "server"},
            "spec": {"template": {"spec": {"containers": [{"name": "s", "image": "i"}]}}},
        },
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "train"},
            "spec": {
                "template": {
                    "spec": {
                        "terminationGracePeriodSeconds": 30,
                        "containers": [{"name": "t", "image": "i"}],
                    }
                }
            },
        },
    ]
    pull: list[tuple[str, dict[str, Any]]] = [("nvcf-pull-0123", {"auths": {}})]
    common: dict[str, Any] = {
        "task_id": "t-1",
        "name": "train",
        "nca_id": "acme",
        "instance_type": "NCP.GPU.H100_1x",
        "backend": "g",
        "region": "r",
        "secrets": {},
        "grace_seconds": 600.0,
        "pull_secrets": pull,
    }
    running = helm_objects(chart, **common)
    [deployment] = [o for o in running if o["kind"] == "Deployment"]
    [job] = [o for o in running if o["kind"] == "Job"]
    for obj in (deployment, job):
        pod = obj["spec"]["template"]["spec"]
        assert pod["terminationGracePeriodSeconds"] == 600
        assert pod["imagePullSecrets"] == [{"name": "nvcf-pull-0123"}]
    assert job["spec"]["suspend"] is False
    [stopping] = [o for o in helm_objects(chart, **common, suspend=True) if o["kind"] == "Job"]
    assert stopping["spec"]["suspend"] is True
