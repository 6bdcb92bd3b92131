"""The worker-utils sidecar in a function's pod (docs/kubernetes.md §6): what the Kubernetes
adapter adds to the objects it applies so that input assets, large outputs and progress files
work as on NVCF. `inject` finds the pod that serves the inference Service's port and gives it

- an `emptyDir` volume `nvcf-files`, mounted at `/var/run/nvcf/files` in the worker container
  and in the sidecar;
- the container `nvcf-worker-utils` (`nvcf-server worker-utils`, the project's own image),
  restricted as the chart policy demands (non-root, no privilege escalation, no capability,
  read-only root file system, RuntimeDefault seccomp), listening on its own port and
  forwarding to the worker on localhost;
- the Service's target moved from the worker's port to the sidecar's (the Service port, which
  the platform calls, stays the same).

The objects are left as they are when the pod is not identifiable (no such Service, or no
single container of a selected pod template exposing the port).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: where the shared volume is mounted in both containers
FILES_MOUNT = "/var/run/nvcf/files"
VOLUME_NAME = "nvcf-files"
CONTAINER_NAME = "nvcf-worker-utils"
#: the sidecar's named port (the Service's new targetPort)
PORT_NAME = "nvcf-utils"
#: the sidecar's port unless the pod uses it already (then the next free one)
DEFAULT_PORT = 8479
#: the Service of a container function (deployments/workload.py)
ENTRYPOINT_SERVICE = "entrypoint"
#: pod-template kinds whose pods may be the worker's
WORKLOAD_KINDS = frozenset({"Deployment", "StatefulSet", "ReplicaSet", "DaemonSet", "Job"})
#: the image's user (Dockerfile): numeric, so that runAsNonRoot can be verified
RUN_AS_USER = 10001


@dataclass(frozen=True)
class WorkerUtilsPod:
    """How the sidecar is made: its image and the bounds it enforces (from the settings)."""

    image: str
    max_asset_bytes: int
    max_result_bytes: int
    max_result_files: int
    timeout_seconds: float
    worker_timeout_seconds: float = 3600.0
    resources: Mapping[str, Mapping[str, str]] = field(
        default_factory=lambda: {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"cpu": "1", "memory": "512Mi"},
        }
    )

    def container(self, port: int, worker_port: int) -> dict[str, Any]:
        return {
            "name": CONTAINER_NAME,
            "image": self.image,
            "command": ["nvcf-server"],
            "args": [
                "worker-utils",
                "--port",
                str(port),
                "--worker-port",
                str(worker_port),
                "--mount",
                FILES_MOUNT,
                "--max-asset-bytes",
                str(self.max_asset_bytes),
                "--max-result-bytes",
                str(self.max_result_bytes),
                "--max-result-files",
                str(self.max_result_files),
                "--timeout",
                f"{self.timeout_seconds:g}",
                "--worker-timeout",
                f"{self.worker_timeout_seconds:g}",
            ],
            "ports": [{"name": PORT_NAME, "containerPort": port, "protocol": "TCP"}],
            "volumeMounts": [{"name": VOLUME_NAME, "mountPath": FILES_MOUNT}],
            "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 10},
            "resources": {k: dict(v) for k, v in self.resources.items()},
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": RUN_AS_USER,
                "runAsGroup": RUN_AS_USER,
                "allowPrivilegeEscalation": False,
                "privileged": False,
                "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"},
            },
        }


def _map(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _serves(container: Mapping[str, Any], target: int | str) -> int | None:
    """The container's port number that `target` (a Service targetPort) names, or None."""
    for port in _list(container.get("ports")):
        port = _map(port)
        number = port.get("containerPort")
        if not isinstance(number, int):
            continue
        if (isinstance(target, str) and port.get("name") == target) or number == target:
            return number
    return None


def _template(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    if obj.get("kind") not in WORKLOAD_KINDS:
        return None
    template = _map(_map(obj.get("spec")).get("template"))
    return template if isinstance(_map(template.get("spec")).get("containers"), list) else None


def inject(objects: Sequence[dict[str, Any]], service: str, port: int, pod: WorkerUtilsPod) -> bool:
    """Add the sidecar to the pod behind `service`'s `port` (in place); whether it was."""
    services = [
        o
        for o in objects
        if o.get("kind") == "Service" and _map(o.get("metadata")).get("name") == service
    ]
    if len(services) != 1:
        return False
    spec = _map(services[0].get("spec"))
    entry = next((_map(p) for p in _list(spec.get("ports")) if _map(p).get("port") == port), None)
    selector = _map(spec.get("selector"))
    if entry is None or not selector:
        return False
    target = entry.get("targetPort", port)
    if not isinstance(target, int | str):
        return False
    found: list[tuple[dict[str, Any], dict[str, Any], int]] = []
    for obj in objects:
        template = _template(obj)
        if template is None:
            continue
        labels = _map(_map(template.get("metadata")).get("labels"))
        if any(labels.get(k) != v for k, v in selector.items()):
            continue
        for container in _list(_map(template.get("spec")).get("containers")):
            number = _serves(_map(container), target)
            if number is not None:
                found.append((template, container, number))
    if len(found) != 1:
        return False
    template, worker, worker_port = found[0]
    pod_spec = template["spec"]
    if any(_map(c).get("name") == CONTAINER_NAME for c in pod_spec["containers"]):
        return True  # applied before (objects given twice)
    used = {
        _map(p).get("containerPort")
        for c in _list(pod_spec.get("containers")) + _list(pod_spec.get("initContainers"))
        for p in _list(_map(c).get("ports"))
    }
    own = DEFAULT_PORT
    while own in used:
        own += 1
    volumes = pod_spec.setdefault("volumes", [])
    volumes.append({"name": VOLUME_NAME, "emptyDir": {}})
    worker.setdefault("volumeMounts", []).append({"name": VOLUME_NAME, "mountPath": FILES_MOUNT})
    pod_spec["containers"].append(pod.container(own, worker_port))
    entry["targetPort"] = PORT_NAME
    return True


__all__ = [
    "CONTAINER_NAME",
    "DEFAULT_PORT",
    "ENTRYPOINT_SERVICE",
    "FILES_MOUNT",
    "PORT_NAME",
    "VOLUME_NAME",
    "WorkerUtilsPod",
    "inject",
]
