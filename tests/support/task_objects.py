"""A task as the Kubernetes adapter sees it (docs/tasks.md): the instance of a task and the
objects the platform hands over for it — a container task's Job and Secret as the tasks package
builds them (service/tasks/workload.py), or a Job written out here to vary the task container
(its NVCT_* env, its volumes); a helm task's rendered objects."""

from __future__ import annotations

import json
from typing import Any

from service.backends import InstanceSpec
from service.clusters.instance_types import parse_instance_type
from service.tasks.workload import helm_objects, job_objects
from tests.support.catalogs import permissive_catalog

TASK_ID = "task-1"
JOB = "task"
#: where the Job written out here puts the task's files (each on a volume of its own)
PROGRESS_FILE = "/var/run/nvct/progress/progress.json"
RESULTS_DIR = "/var/run/nvct/results"


def task_instance(task_id: str = TASK_ID) -> InstanceSpec:
    return InstanceSpec(
        instance_id=task_id,
        task=True,
        function_id="",
        version_id="",
        nca_id="nca-1",
        instance_type="NCP.GPU.H100_1x",
        gpu="H100",
        gpus_per_node=1,
        cluster="k8s-test",
    )


def task_container(
    progress: str = PROGRESS_FILE, results: str = RESULTS_DIR, **extra: Any
) -> dict[str, Any]:
    return {
        "name": "task",
        "image": "nvcr.io/acme/trainer:1.0",
        "env": [
            {"name": "NVCT_TASK_ID", "value": TASK_ID},
            {"name": "NVCT_TASK_NAME", "value": "fine-tune"},
            {"name": "NVCT_NCA_ID", "value": "nca-1"},
            {"name": "NVCT_PROGRESS_FILE_PATH", "value": progress},
            {"name": "NVCT_RESULTS_DIR", "value": results},
        ],
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
        "volumeMounts": [
            {"name": "secrets", "mountPath": "/var/secrets", "readOnly": True},
            {"name": "nvct-progress", "mountPath": "/var/run/nvct/progress"},
            {"name": "nvct-results", "mountPath": "/var/run/nvct/results"},
        ],
        **extra,
    }


def job(
    container: dict[str, Any] | None = None,
    *,
    deadline: int | None = 3600,
    grace: int = 3600,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "backoffLimit": 0,
        "template": {
            "metadata": {"labels": {"app": "task"}},
            "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": grace,
                "automountServiceAccountToken": False,
                "containers": [container or task_container()],
                "volumes": [
                    {"name": "secrets", "secret": {"secretName": "nvct-secrets"}},
                    {"name": "nvct-progress", "emptyDir": {}},
                    {"name": "nvct-results", "emptyDir": {}},
                ],
            },
        },
    }
    if deadline is not None:
        spec["activeDeadlineSeconds"] = deadline
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": JOB, "labels": {"app": "task"}},
        "spec": spec,
    }


def secret(values: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "nvct-secrets"},
        "type": "Opaque",
        "stringData": {"secrets.json": json.dumps(values or {"HF_TOKEN": "hf-secret"})},
    }


def task_objects(
    *, max_runtime_seconds: float | None = 3600, suspend: bool = False
) -> list[dict[str, Any]]:
    """A container task's objects as the platform builds them: its Secret and its Job."""
    cluster = permissive_catalog().cluster("sim-ncp")
    assert cluster is not None
    return job_objects(
        task_id=TASK_ID,
        name="fine-tune",
        nca_id="nca-1",
        image="nvcr.io/acme/trainer:1.0",
        args="python train.py --epochs 3",
        environment=[{"key": "EPOCHS", "value": "3"}],
        cluster=cluster,
        backend="k8s-group",
        instance_type=parse_instance_type("NCP.GPU.H100_1x"),
        max_runtime_seconds=max_runtime_seconds,
        grace_seconds=600,
        secrets={"HF_TOKEN": "hf-secret"},
        suspend=suspend,
    )


def helm_task_chart() -> list[dict[str, Any]]:
    """A helm task's rendered chart: a ConfigMap, a ServiceAccount, a metrics Service, a
    dashboard Deployment and the Job `trainer` running the task."""
    trainer = {
        "name": "trainer",
        "image": "nvcr.io/acme/trainer:1.0",
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
    }
    dashboard = {"name": "dashboard", "image": "nvcr.io/acme/dashboard:1.0"}
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "trainer-config"},
            "data": {"epochs": "3"},
        },
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "trainer"}},
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "trainer-metrics"},
            "spec": {"selector": {"app": "trainer"}, "ports": [{"port": 9090}]},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "dashboard"},
            "spec": {
                "selector": {"matchLabels": {"app": "dashboard"}},
                "template": {
                    "metadata": {"labels": {"app": "dashboard"}},
                    "spec": {"containers": [dashboard]},
                },
            },
        },
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "trainer"},
            "spec": {
                "backoffLimit": 0,
                "template": {
                    "metadata": {"labels": {"app": "trainer"}},
                    "spec": {"restartPolicy": "Never", "containers": [trainer]},
                },
            },
        },
    ]


def helm_task_objects() -> list[dict[str, Any]]:
    """The helm task's objects as the platform installs them (service/tasks/workload.py: the
    helm install mutations and NVCT's variables in every container)."""
    return helm_objects(
        helm_task_chart(),
        task_id=TASK_ID,
        name="fine-tune",
        nca_id="nca-1",
        instance_type="NCP.GPU.H100_1x",
        backend="k8s-group",
        region="us-west-2",
        secrets={"HF_TOKEN": "hf-secret"},
        grace_seconds=600,
    )
