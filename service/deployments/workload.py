"""The Kubernetes objects of a container function (runtime.md §3): one Deployment running the
function's image and a ClusterIP Service `entrypoint` in front of it.

They are stored per GPU specification like a helm chart's validated objects and receive the
same install-time mutations (helm.md §5: labels, NVCF_* environment, pull secrets, node
affinity) from the reconciler.
"""

from __future__ import annotations

import shlex
from decimal import Decimal
from typing import Any

from service.backends.worker_utils_pod import ENTRYPOINT_SERVICE
from service.clusters.catalog import Cluster
from service.clusters.instance_types import InstanceType
from service.core.durations import DurationError, parse_timedelta
from service.core.kube import GPU_RESOURCE
from service.core.quantities import quantity
from service.functions.models import FunctionVersion

SERVICE_NAME = ENTRYPOINT_SERVICE
WORKLOAD_NAME = "inference"
CONTAINER_NAME = "inference"
DEFAULT_PORT = 8000
APP_LABEL = "app.kubernetes.io/name"
#: Share of a node's CPU and memory given to the GPUs of one instance (the rest is left to
#: the kubelet and system daemons).
NODE_SHARE = Decimal("0.9")
#: Per-GPU CPU and memory when the catalog does not say what a node has.
DEFAULT_CPU_PER_GPU = Decimal(8)
DEFAULT_MEMORY_PER_GPU = Decimal(32 * 1024**3)


def duration_seconds(value: str, default: int = 10) -> int:
    """Whole seconds (≥ 1) of an ISO-8601 duration such as `PT10S`; `default` if unparsable."""
    try:
        total = parse_timedelta(value.strip().upper()).total_seconds()
    except DurationError:
        return default
    return max(1, int(total))


def _per_node(value: str | None, fallback: Decimal, share: Decimal, gpus_per_node: int) -> Decimal:
    """This instance's share of a node quantity (the catalog checked that it is one)."""
    amount = quantity(value) if value is not None else None
    if amount is None:
        return fallback * share
    return amount * share / gpus_per_node * NODE_SHARE


def instance_resources(cluster: Cluster, instance_type: InstanceType) -> dict[str, str]:
    """Limits of one instance: its GPUs and its share of the node's CPU and memory."""
    shape = next(
        (
            s
            for s in cluster.nodes
            if s.gpu == instance_type.gpu and s.gpus_per_node >= instance_type.gpus_per_node
        ),
        None,
    )
    share = Decimal(instance_type.gpus_per_node)
    per_node = shape.gpus_per_node if shape is not None else 1
    cpu = _per_node(shape.cpu if shape else None, DEFAULT_CPU_PER_GPU, share, per_node)
    memory = _per_node(shape.memory if shape else None, DEFAULT_MEMORY_PER_GPU, share, per_node)
    millicores = max(100, int(cpu * 1000))
    mebibytes = max(256, int(memory / 2**20))
    return {
        "cpu": f"{millicores}m" if millicores % 1000 else str(millicores // 1000),
        "memory": f"{mebibytes}Mi",
        GPU_RESOURCE: str(instance_type.gpus_per_node),
    }


def _args(container_args: str | None) -> list[str] | None:
    if not container_args or not container_args.strip():
        return None
    try:
        return shlex.split(container_args)
    except ValueError:
        # Unbalanced quotes: hand the string over as one argument rather than guessing.
        return [container_args]


def _probe(version: FunctionVersion, port: int) -> dict[str, Any]:
    health = version.health or {}
    probe_port = int(health.get("port") or port)
    timeout = duration_seconds(str(health.get("timeout") or "PT10S"))
    probe: dict[str, Any]
    if str(health.get("protocol", "HTTP")).lower() == "grpc":
        probe = {"grpc": {"port": probe_port}}
    else:
        probe = {
            "httpGet": {"path": str(health.get("uri") or "/v2/health/ready"), "port": probe_port}
        }
    probe.update(
        {
            "timeoutSeconds": timeout,
            "periodSeconds": 10,
            "failureThreshold": 3,
            "successThreshold": 1,
        }
    )
    return probe


def container_objects(
    version: FunctionVersion, instance_type: InstanceType, cluster: Cluster
) -> list[dict[str, Any]]:
    """The Deployment and Service of a container function for one instance type on `cluster`
    (the first candidate: its node shape sizes the CPU and memory limits)."""
    if version.container_image is None:
        raise ValueError("container_objects needs a container function")
    port = version.inference_port or DEFAULT_PORT
    is_grpc = str((version.health or {}).get("protocol", "HTTP")).lower() == "grpc"
    port_name = "grpc" if is_grpc else "http"
    labels = {APP_LABEL: WORKLOAD_NAME}
    limits = instance_resources(cluster, instance_type)
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": version.container_image,
        "ports": [{"name": port_name, "containerPort": port, "protocol": "TCP"}],
        "env": [
            {"name": str(e["key"]), "value": str(e["value"])}
            for e in (version.container_environment or [])
        ],
        "readinessProbe": _probe(version, port),
        "resources": {"limits": dict(limits), "requests": dict(limits)},
    }
    args = _args(version.container_args)
    if args is not None:
        container["args"] = args
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": WORKLOAD_NAME, "labels": dict(labels)},
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": dict(labels)},
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    "automountServiceAccountToken": False,
                    "containers": [container],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": SERVICE_NAME, "labels": dict(labels)},
        "spec": {
            "type": "ClusterIP",
            "selector": dict(labels),
            "ports": [
                {"name": port_name, "port": port, "targetPort": port_name, "protocol": "TCP"}
            ],
        },
    }
    return [deployment, service]
