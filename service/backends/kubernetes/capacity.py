"""Reading a cluster's capacity from its objects: GPU nodes (labelled with an instance type, their
allocatable `nvidia.com/gpu`) and what their running pods request."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from service.backends.protocol import Capacity, ShapeCapacity
from service.backends.scheduling import gpu_request, node_affinity_matches
from service.core.kube import (
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    INSTANCE_TYPE_LABEL,
    NAMESPACE_PREFIX,
)
from service.core.quantities import whole_quantity


def as_map(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def labels_of(obj: Mapping[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in as_map(as_map(obj.get("metadata")).get("labels")).items()}


def gpu_model(labels: Mapping[str, str]) -> str:
    """`NCP.GPU.H100` -> `H100`; else the GPU feature discovery product label."""
    instance_type = labels.get(INSTANCE_TYPE_LABEL, "")
    if ".GPU." in instance_type.upper():
        return instance_type.upper().split(".GPU.", 1)[1]
    return labels.get(GPU_PRODUCT_LABEL, "").upper()


def node_usable(node: Mapping[str, Any]) -> bool:
    if as_map(node.get("spec")).get("unschedulable"):
        return False
    for cond in as_map(node.get("status")).get("conditions") or []:
        if as_map(cond).get("type") == "Ready":
            return as_map(cond).get("status") == "True"
    return True


def unschedulable(pod: Mapping[str, Any]) -> bool:
    for cond in as_map(pod.get("status")).get("conditions") or []:
        cond = as_map(cond)
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return cond.get("reason") == "Unschedulable"
    return False


@dataclass
class Node:
    name: str
    gpu: str
    gpus: int
    labels: dict[str, str]
    used: int = 0


def gpu_nodes(nodes: Iterable[Mapping[str, Any]]) -> list[Node]:
    """The usable nodes with allocatable GPUs of a known model, by name."""
    usable: list[Node] = []
    for node in sorted(nodes, key=lambda n: str(as_map(n.get("metadata")).get("name", ""))):
        labels = labels_of(node)
        gpus = whole_quantity(
            as_map(as_map(node.get("status")).get("allocatable")).get(GPU_RESOURCE)
        )
        gpu = gpu_model(labels)
        if gpus <= 0 or not gpu or not node_usable(node):
            continue
        name = str(as_map(node.get("metadata")).get("name", ""))
        usable.append(Node(name, gpu, gpus, labels))
    return usable


def count_pods(nodes: list[Node], pods: Iterable[Mapping[str, Any]]) -> None:
    """Count GPUs of bound pods, then of our not-yet-bound pods, against the nodes."""
    by_name = {n.name: n for n in nodes}
    waiting: list[Mapping[str, Any]] = []
    for pod in pods:
        spec = as_map(pod.get("spec"))
        gpus = gpu_request(spec)
        if gpus <= 0:
            continue
        node = by_name.get(str(spec.get("nodeName") or ""))
        if node is not None:
            node.used += gpus
        elif (
            not spec.get("nodeName")
            and str(as_map(pod.get("metadata")).get("namespace", "")).startswith(NAMESPACE_PREFIX)
            and not unschedulable(pod)
        ):
            waiting.append(pod)
    waiting.sort(key=lambda p: str(as_map(p.get("metadata")).get("creationTimestamp", "")))
    for pod in waiting:
        spec = as_map(pod.get("spec"))
        gpus = gpu_request(spec)
        fitting = [
            n for n in nodes if n.gpus - n.used >= gpus and node_affinity_matches(spec, n.labels)
        ]
        if fitting:
            min(fitting, key=lambda n: (n.gpus - n.used, n.name)).used += gpus


def free_capacity(nodes: Iterable[Node]) -> Capacity:
    """The free GPUs of the nodes, per node shape."""
    shapes: dict[tuple[str, int], list[int]] = {}
    for n in nodes:
        shapes.setdefault((n.gpu, n.gpus), []).append(max(n.gpus - n.used, 0))
    return Capacity(
        tuple(ShapeCapacity(gpu, per_node, tuple(free)) for (gpu, per_node), free in shapes.items())
    )
