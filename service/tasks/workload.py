"""A container task as Kubernetes objects: a batch/v1 Job that runs once (no retries,
`activeDeadlineSeconds` from maxRuntimeDuration, the grace period on stop) and the Secret of
its secrets (`secrets.json` at /var/secrets), with NVCT's contract in the container:
`NVCT_TASK_ID`, `NVCT_TASK_NAME`, `NVCT_NCA_ID`, `NVCT_PROGRESS_FILE_PATH`,
`NVCT_RESULTS_DIR` on a shared emptyDir, and /config/models and /config/resources as empty
directories: a task's `models` and `resources` are recorded, not downloaded, as a function's
are (docs/registry-credentials.md: this server pulls neither). Both kinds of task pass
through the helm functions' install mutations, as a function's pods do: labels, node affinity
on the instance type's node label, the account's image pull Secrets and the Secret at
/var/secrets."""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from service.charts.findings import containers, pod_templates
from service.charts.mutate import mutate_for_install
from service.clusters.catalog import Cluster
from service.clusters.instance_types import InstanceType
from service.core.kube import SECRETS_DIR, SECRETS_OBJECT, SECRETS_VOLUME, instance_namespace
from service.deployments.workload import instance_resources

JOB_NAME = "task"
CONTAINER_NAME = "task"
#: the shared directory of the task container and the worker utilities
TASK_VOLUME = "nvct"
TASK_DIR = "/var/nvct"
PROGRESS_FILE = f"{TASK_DIR}/progress.json"
RESULTS_DIR = f"{TASK_DIR}/results"
MODELS_DIR = "/config/models"
RESOURCES_DIR = "/config/resources"
TASK_LABEL = "nvct.nvidia.com/task-id"


def task_env(task_id: str, name: str, nca_id: str) -> list[dict[str, str]]:
    return [
        {"name": "NVCT_TASK_ID", "value": task_id},
        {"name": "NVCT_TASK_NAME", "value": name},
        {"name": "NVCT_NCA_ID", "value": nca_id},
        {"name": "NVCT_PROGRESS_FILE_PATH", "value": PROGRESS_FILE},
        {"name": "NVCT_RESULTS_DIR", "value": RESULTS_DIR},
    ]


def job_objects(
    *,
    task_id: str,
    name: str,
    nca_id: str,
    image: str,
    args: str | None,
    environment: list[Any] | None,
    cluster: Cluster,
    backend: str,
    instance_type: InstanceType,
    max_runtime_seconds: float | None,
    grace_seconds: float,
    secrets: Mapping[str, str],
    pull_secrets: Sequence[tuple[str, Mapping[str, Any]]] = (),
    suspend: bool = False,
) -> list[dict[str, Any]]:
    """The pull Secrets, the Secret and the Job of one container task; `suspend` asks its pod
    to stop (Kubernetes deletes a suspended Job's pods, each within its grace period)."""
    limits = instance_resources(cluster, instance_type)
    env = [{"name": str(e["key"]), "value": str(e["value"])} for e in environment or []]
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": image,
        # NVCT's variables win over the same names in containerEnvironment
        "env": [e for e in env if not e["name"].startswith("NVCT_")]
        + task_env(task_id, name, nca_id),
        "resources": {"limits": dict(limits), "requests": dict(limits)},
        "volumeMounts": [
            {"name": TASK_VOLUME, "mountPath": TASK_DIR},
            {"name": SECRETS_VOLUME, "mountPath": SECRETS_DIR, "readOnly": True},
            {"name": "models", "mountPath": MODELS_DIR},
            {"name": "resources", "mountPath": RESOURCES_DIR},
        ],
    }
    if args:
        container["args"] = shlex.split(args)
    labels = {TASK_LABEL: task_id}
    spec: dict[str, Any] = {
        "backoffLimit": 0,
        "suspend": suspend,
        "template": {
            "metadata": {"labels": dict(labels)},
            "spec": {
                "restartPolicy": "Never",
                "automountServiceAccountToken": False,
                "terminationGracePeriodSeconds": max(0, math.ceil(grace_seconds)),
                "containers": [container],
                "volumes": [
                    {"name": TASK_VOLUME, "emptyDir": {}},
                    {"name": SECRETS_VOLUME, "secret": {"secretName": SECRETS_OBJECT}},
                    {"name": "models", "emptyDir": {}},
                    {"name": "resources", "emptyDir": {}},
                ],
            },
        },
    }
    if max_runtime_seconds is not None:
        spec["activeDeadlineSeconds"] = max(1, math.ceil(max_runtime_seconds))
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": JOB_NAME, "labels": dict(labels)},
        "spec": spec,
    }
    return mutate_for_install(
        [job],
        namespace=instance_namespace(task_id),
        instance_id=task_id,
        function_id="",
        version_id="",
        function_name=name,
        nca_id=nca_id,
        instance_type=instance_type.name,
        backend=backend,
        region=cluster.region,
        pull_secrets=pull_secrets,
        secrets=secrets,
    )


def helm_objects(
    objects: list[Any],
    *,
    task_id: str,
    name: str,
    nca_id: str,
    instance_type: str,
    backend: str,
    region: str,
    secrets: Mapping[str, str],
    grace_seconds: float,
    pull_secrets: Sequence[tuple[str, Mapping[str, Any]]] = (),
    suspend: bool = False,
    nvlink: bool = False,
) -> list[dict[str, Any]]:
    """A helm task's rendered objects as installed: the helm functions' install mutations
    (labels, pod rules, the Secret at /var/secrets, and on an NVLinkOptimized cluster, `nvlink`,
    the ComputeDomain and its claims), NVCT's variables in every container and the task's
    grace period in every pod (a pod deleted is killed only after it); `suspend` suspends its
    Jobs, asking their pods to stop, as a container task's."""
    out = mutate_for_install(
        objects,
        namespace=instance_namespace(task_id),
        instance_id=task_id,
        function_id="",
        version_id="",
        function_name=name,
        nca_id=nca_id,
        instance_type=instance_type,
        backend=backend,
        region=region,
        pull_secrets=pull_secrets,
        nvlink=nvlink,
        secrets=secrets,
    )
    env = task_env(task_id, name, nca_id)
    for obj in out:
        if is_job(obj):
            obj["spec"]["suspend"] = suspend
        for _, template in pod_templates(obj):
            template["spec"]["terminationGracePeriodSeconds"] = max(0, math.ceil(grace_seconds))
            for _, _, container in containers(template["spec"]):
                kept = [
                    e
                    for e in container.get("env") or []
                    if not str(e.get("name", "")).startswith("NVCT_")
                ]
                container["env"] = kept + [dict(e) for e in env]
    return out


def is_job(obj: Mapping[str, Any]) -> bool:
    return (
        obj.get("kind") == "Job"
        and str(obj.get("apiVersion", "")).startswith("batch/")
        and isinstance(obj.get("spec"), dict)
    )
