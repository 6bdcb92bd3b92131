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

A task's pod (docs/kubernetes.md §7) gets the sidecar from `inject_task` instead: the one
container of the objects' pod templates whose env names `NVCT_PROGRESS_FILE_PATH` and
`NVCT_RESULTS_DIR` is the task's; the sidecar becomes a native sidecar (an initContainer with
`restartPolicy: Always`, so that a Job completes when the task container exits), mounts
read-only the volumes that hold those two paths in the task container (an `emptyDir` is added
for a path no volume holds), serves them (service/assets/task_files.py), and holds the pod's
end in its `preStop` hook until the platform has fetched the last result.
"""

from __future__ import annotations

import posixpath
import re
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
#: a task container's env naming its files (NVCT's contract, docs/tasks.md)
PROGRESS_ENV = "NVCT_PROGRESS_FILE_PATH"
RESULTS_ENV = "NVCT_RESULTS_DIR"
#: what the sidecar of a task's pod serves (service/assets/task_files.py)
PROGRESS_PATH = "/nvct/progress"
RESULTS_PATH = "/nvct/results"
RESULTS_PREFIX = f"{RESULTS_PATH}/"
LINGER_PATH = "/nvct/linger"
RELEASE_PATH = "/nvct/release"
#: a result's name, as NVCT's progress file allows it (1-190 letters, digits and
#: ! - _ . * ' ( )) and not starting with '.': one path segment, never '.', '..' or a hidden
#: directory (an upload's tag is made of it: tasks/results.py)
RESULT_NAME = re.compile(r"[A-Za-z0-9!\-_*'()][A-Za-z0-9!\-_.*'()]{0,189}")
#: the longest name `RESULT_NAME` allows
RESULT_NAME_MAX = 190
#: what `RESULT_NAME` allows, in words
RESULT_NAME_RULE = "1-190 letters, digits and ! - _ . * ' ( ), not starting with '.'"
#: the volumes added for a task path that no volume of the task container holds
TASK_VOLUME = "nvct-files"

SECURITY_CONTEXT: Mapping[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": RUN_AS_USER,
    "runAsGroup": RUN_AS_USER,
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


@dataclass(frozen=True)
class WorkerUtilsPod:
    """How the sidecar is made: its image and the bounds it enforces (from the settings)."""

    image: str
    max_asset_bytes: int
    max_result_bytes: int
    max_result_files: int
    timeout_seconds: float
    worker_timeout_seconds: float = 3600.0
    #: seconds a task's pod waits, once its task container has exited, for the platform to
    #: fetch the last result and release it
    task_linger_seconds: float = 300.0
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
            "securityContext": _security_context(),
        }

    def task_container(
        self, port: int, progress: str, results: str, mounts: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """The native sidecar of a task's pod, reading `progress` and `results` through
        `mounts` (read-only)."""
        return {
            "name": CONTAINER_NAME,
            "image": self.image,
            "command": ["nvcf-server"],
            "args": [
                "worker-utils",
                "--port",
                str(port),
                "--task-progress-file",
                progress,
                "--task-results-dir",
                results,
                "--max-result-bytes",
                str(self.max_result_bytes),
                "--max-result-files",
                str(self.max_result_files),
                "--timeout",
                f"{self.timeout_seconds:g}",
                "--linger",
                f"{self.task_linger_seconds:g}",
            ],
            "restartPolicy": "Always",
            "ports": [{"name": PORT_NAME, "containerPort": port, "protocol": "TCP"}],
            "volumeMounts": mounts,
            "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 10},
            "lifecycle": {"preStop": {"httpGet": {"path": LINGER_PATH, "port": port}}},
            "resources": {k: dict(v) for k, v in self.resources.items()},
            "securityContext": _security_context(),
        }


def _security_context() -> dict[str, Any]:
    return {k: dict(v) if isinstance(v, Mapping) else v for k, v in SECURITY_CONTEXT.items()}


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
    own = _free_port(pod_spec)
    volumes = pod_spec.setdefault("volumes", [])
    volumes.append({"name": VOLUME_NAME, "emptyDir": {}})
    worker.setdefault("volumeMounts", []).append({"name": VOLUME_NAME, "mountPath": FILES_MOUNT})
    pod_spec["containers"].append(pod.container(own, worker_port))
    entry["targetPort"] = PORT_NAME
    return True


def _env(container: Mapping[str, Any], name: str) -> str | None:
    for item in _list(container.get("env")):
        item = _map(item)
        if item.get("name") == name and isinstance(item.get("value"), str):
            value = posixpath.normpath(item["value"])
            return value if value.startswith("/") and value != "/" else None
    return None


def _holding(mounts: list[Any], path: str) -> dict[str, Any] | None:
    """The volume mount under which `path` lies (the deepest), or None."""
    best: dict[str, Any] | None = None
    for mount in mounts:
        mount = _map(mount)
        where = posixpath.normpath(str(mount.get("mountPath") or "/"))
        if (path == where or path.startswith(where.rstrip("/") + "/")) and (
            best is None or len(where) > len(str(best["mountPath"]))
        ):
            best = {**mount, "mountPath": where}
    return best


def _free_port(pod_spec: Mapping[str, Any]) -> int:
    used = {
        _map(p).get("containerPort")
        for c in _list(pod_spec.get("containers")) + _list(pod_spec.get("initContainers"))
        for p in _list(_map(c).get("ports"))
    }
    own = DEFAULT_PORT
    while own in used:
        own += 1
    return own


def task_container_of(
    objects: Sequence[dict[str, Any]],
) -> tuple[dict[str, Any], dict[str, Any], str, str] | None:
    """The one pod template, container, progress path and results path of a task's objects:
    the one container naming both paths, or else the one of a Job's pod naming them (a
    chart's other workloads may be given the same environment)."""
    found = []
    for obj in objects:
        template = _template(obj)
        if template is None:
            continue
        for container in _list(_map(template.get("spec")).get("containers")):
            progress, results = _env(_map(container), PROGRESS_ENV), _env(container, RESULTS_ENV)
            if progress is not None and results is not None:
                found.append((obj.get("kind") == "Job", (template, container, progress, results)))
    if len(found) == 1:
        return found[0][1]
    in_jobs = [f for job, f in found if job]
    return in_jobs[0] if len(in_jobs) == 1 else None


def inject_task(objects: Sequence[dict[str, Any]], pod: WorkerUtilsPod) -> bool:
    """Add the native sidecar to a task's pod (in place); whether it was."""
    found = task_container_of(objects)
    if found is None:
        return False
    template, task, progress, results = found
    pod_spec = template["spec"]
    init = pod_spec.setdefault("initContainers", [])
    if any(_map(c).get("name") == CONTAINER_NAME for c in init):
        return True  # applied before (objects given twice)
    mounts: list[dict[str, Any]] = []
    task_mounts = task.setdefault("volumeMounts", [])
    for path, folder in ((progress, posixpath.dirname(progress)), (results, results)):
        held = _holding(task_mounts, path)
        if held is None:
            name = f"{TASK_VOLUME}-{len(mounts)}"
            pod_spec.setdefault("volumes", []).append({"name": name, "emptyDir": {}})
            held = {"name": name, "mountPath": folder}
            task_mounts.append(dict(held))
        mount = {**held, "readOnly": True}
        if all(m["mountPath"] != mount["mountPath"] for m in mounts):
            mounts.append(mount)
    init.append(pod.task_container(_free_port(pod_spec), progress, results, mounts))
    return True


__all__ = [
    "CONTAINER_NAME",
    "DEFAULT_PORT",
    "ENTRYPOINT_SERVICE",
    "FILES_MOUNT",
    "LINGER_PATH",
    "PORT_NAME",
    "PROGRESS_ENV",
    "PROGRESS_PATH",
    "RELEASE_PATH",
    "RESULTS_ENV",
    "RESULTS_PATH",
    "RESULTS_PREFIX",
    "RESULT_NAME",
    "RESULT_NAME_MAX",
    "RESULT_NAME_RULE",
    "VOLUME_NAME",
    "WorkerUtilsPod",
    "inject",
    "inject_task",
    "task_container_of",
]
