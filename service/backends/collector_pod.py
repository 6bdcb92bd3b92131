"""The OpenTelemetry Collector sidecar of a workload that names telemetries: what the Kubernetes
adapter adds to the objects it applies (docs/telemetry-export.md, "On Kubernetes").

The instance's `TelemetrySidecar` holds the collector's configuration (made by
observability/collector.py; it names each key only as `${env:NAME}`) and those keys. `inject`
adds

- the ConfigMap `nvcf-otel-collector` holding the configuration, and the Secret
  `nvcf-telemetry` holding the keys (the container takes them with `secretKeyRef`: never a
  plain env value);
- to every pod (template) of the objects, the container `nvcf-otel-collector`: a plain
  container beside a Deployment's (StatefulSet's, DaemonSet's, a Pod's) containers, so that it
  never holds the workload's start; a native sidecar (an initContainer with `restartPolicy:
  Always`) in a Job's (or CronJob's) pod, so that the Job still completes when its container
  exits. It has no probe: a running collector is ready, and a slow or refusing endpoint never
  makes it unready or restarted (only a collector that cannot run at all, its image not
  pulled, holds the pod's readiness, as any container does). It has bounded resources, and
  reads the pod's own container log directories only: `/var/log/pods` of the node mounted
  read-only with a `subPathExpr` of the pod's namespace, name and uid.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

CONTAINER_NAME = "nvcf-otel-collector"
CONFIG_MAP = "nvcf-otel-collector"
KEYS_SECRET = "nvcf-telemetry"  # noqa: S105 (a name)
CONFIG_FILE = "config.yaml"
#: the pod template annotation holding the keys' checksum (a new key rolls the pods)
KEYS_CHECKSUM = "nvcf.nvidia.com/telemetry-keys-sha256"
CONFIG_DIR = "/etc/nvcf-otelcol"
#: where the pod's own log directory (`/var/log/pods/<ns>_<pod>_<uid>`) is seen
LOGS_DIR = "/var/log/pods/self"
HOST_LOGS = "/var/log/pods"
#: the collector's own writable directory: how far it read each log file, kept across its
#: restarts in the pod (an emptyDir), so that a restart sends no line twice
STATE_DIR = "/var/lib/nvcf-otelcol"
CONFIG_VOLUME = "nvcf-otelcol-config"
LOGS_VOLUME = "nvcf-otelcol-pod-logs"
STATE_VOLUME = "nvcf-otelcol-state"
#: the downward-API variables the log mount's subPathExpr (and the configuration) read
POD_ENV: Mapping[str, str] = {
    "POD_NAMESPACE": "metadata.namespace",
    "POD_NAME": "metadata.name",
    "POD_UID": "metadata.uid",
}
#: where each workload kind holds its pod's spec, and whether its pods run to completion
POD_SPECS: Mapping[str, tuple[tuple[str, ...], bool]] = {
    "Deployment": (("spec", "template", "spec"), False),
    "StatefulSet": (("spec", "template", "spec"), False),
    "ReplicaSet": (("spec", "template", "spec"), False),
    "DaemonSet": (("spec", "template", "spec"), False),
    "Pod": (("spec",), False),
    "Job": (("spec", "template", "spec"), True),
    "CronJob": (("spec", "jobTemplate", "spec", "template", "spec"), True),
}


@dataclass(frozen=True)
class TelemetrySidecar:
    """One instance's collector: its configuration and the keys it references by env name."""

    config: Mapping[str, Any]
    #: env name -> key (write-only: never in a repr, a log or an event)
    keys: Mapping[str, str] = field(repr=False)

    def keys_checksum(self) -> str:
        """A SHA-256 of the keys (never the keys): what changes when one is replaced."""
        text = json.dumps(dict(self.keys), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def config_text(self) -> str:
        # JSON is YAML: the collector reads the file as YAML
        return json.dumps(self.config, indent=2, sort_keys=True)


@dataclass(frozen=True)
class CollectorPod:
    """How the sidecar is made: its image (`NVCF_TELEMETRY_COLLECTOR_IMAGE`) and resources."""

    image: str
    resources: Mapping[str, Mapping[str, str]] = field(
        default_factory=lambda: {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"cpu": "500m", "memory": "256Mi"},
        }
    )

    def container(self, sidecar: TelemetrySidecar, *, native: bool) -> dict[str, Any]:
        env: list[dict[str, Any]] = [
            {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}
            for name, path in POD_ENV.items()
        ]
        env += [
            {"name": name, "valueFrom": {"secretKeyRef": {"name": KEYS_SECRET, "key": name}}}
            for name in sorted(sidecar.keys)
        ]
        container: dict[str, Any] = {
            "name": CONTAINER_NAME,
            "image": self.image,
            "args": [f"--config={CONFIG_DIR}/{CONFIG_FILE}"],
            "env": env,
            "volumeMounts": [
                {"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True},
                {
                    "name": LOGS_VOLUME,
                    "mountPath": LOGS_DIR,
                    "subPathExpr": "$(POD_NAMESPACE)_$(POD_NAME)_$(POD_UID)",
                    "readOnly": True,
                },
                {"name": STATE_VOLUME, "mountPath": STATE_DIR},
            ],
            "resources": {k: dict(v) for k, v in self.resources.items()},
            # the kubelet writes the log files as root (0640): read as root, nothing more
            "securityContext": {
                "runAsUser": 0,
                "runAsNonRoot": False,
                "allowPrivilegeEscalation": False,
                "privileged": False,
                "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"},
            },
        }
        if native:
            container["restartPolicy"] = "Always"
        return container

    def objects(self, sidecar: TelemetrySidecar) -> list[dict[str, Any]]:
        """The ConfigMap of the configuration and the Secret of the keys."""
        return [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": CONFIG_MAP},
                "data": {CONFIG_FILE: sidecar.config_text()},
            },
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": KEYS_SECRET},
                "type": "Opaque",
                "stringData": dict(sidecar.keys),
            },
        ]


def _map(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def inject(objects: list[dict[str, Any]], sidecar: TelemetrySidecar, pod: CollectorPod) -> bool:
    """Add the collector to every pod template of `objects` and its ConfigMap and Secret to
    `objects` (in place); whether any pod template was found. The pod template of a workload
    that does not run to completion is annotated with the checksum of the keys
    (`KEYS_CHECKSUM`), so that applying it again with a new key rolls its pods (the collector
    reads its keys when it starts); a Job's template cannot change, and its running pod keeps
    the key it started with."""
    templates: list[tuple[bool, dict[str, Any]]] = []
    checksum = sidecar.keys_checksum()
    for obj in objects:
        path, completes = POD_SPECS.get(str(obj.get("kind")), ((), False))
        spec: dict[str, Any] = obj if path else {}
        template: dict[str, Any] = {}
        for key in path:
            template, spec = spec, _map(spec.get(key))
        if isinstance(spec.get("containers"), list):
            templates.append((completes, spec))
            if not completes and path[-2:] == ("template", "spec"):
                metadata = template.setdefault("metadata", {})
                if isinstance(metadata, dict):
                    metadata.setdefault("annotations", {})[KEYS_CHECKSUM] = checksum
    if not templates:
        return False
    for completes, spec in templates:
        where = spec.setdefault("initContainers", []) if completes else spec["containers"]
        if any(_map(c).get("name") == CONTAINER_NAME for c in where):
            continue  # applied before (objects given twice)
        where.append(pod.container(sidecar, native=completes))
        spec.setdefault("volumes", []).extend(
            [
                {"name": CONFIG_VOLUME, "configMap": {"name": CONFIG_MAP}},
                {"name": LOGS_VOLUME, "hostPath": {"path": HOST_LOGS, "type": "Directory"}},
                {"name": STATE_VOLUME, "emptyDir": {"sizeLimit": "64Mi"}},
            ]
        )
    names = {(o.get("kind"), _map(o.get("metadata")).get("name")) for o in objects}
    objects.extend(
        o for o in pod.objects(sidecar) if (o["kind"], o["metadata"]["name"]) not in names
    )
    return True
