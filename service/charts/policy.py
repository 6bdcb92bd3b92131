"""Restrictions on rendered objects (helm.md §3 and §3.1), collecting every violation.

Rule ids: `too-many-objects`, `missing-name`, `crd-skipped`, `kind-not-allowed`,
`service-type`, `volume-type`, `container-image`, `service-not-found`, `service-duplicate`,
`service-port`, `service-target`, `multi-node-full-node`, `resources-limits`, and the
`security-*` rules of pod_security.py.

`Unrestricted` (which only a cluster permitting it accepts) is NVCF's: it skips the kind,
Service type, volume, security and resource rules; the size, name and inference-Service rules
always apply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from service.charts.findings import (
    Finding,
    KubeObject,
    Severity,
    containers,
    is_kind,
    items,
    join,
    metadata,
    object_name,
    object_ref,
    pod_templates,
    replica_count,
)
from service.charts.pod_security import pod_security
from service.core.quantities import whole_quantity

MAX_OBJECTS = 300

ALLOWED_TYPES: frozenset[tuple[str, str, str]] = frozenset(
    {
        ("", "v1", "ConfigMap"),
        ("", "v1", "Secret"),
        ("", "v1", "Service"),
        ("", "v1", "Pod"),
        ("", "v1", "ServiceAccount"),
        ("", "v1", "PersistentVolumeClaim"),
        ("apps", "v1", "Deployment"),
        ("apps", "v1", "ReplicaSet"),
        ("apps", "v1", "StatefulSet"),
        ("batch", "v1", "Job"),
        ("batch", "v1", "CronJob"),
        ("rbac.authorization.k8s.io", "v1", "Role"),
        ("rbac.authorization.k8s.io", "v1", "RoleBinding"),
    }
)
ALLOWED_VOLUMES = frozenset(
    {"configMap", "secret", "persistentVolumeClaim", "emptyDir", "projected"}
)
ALLOWED_PROJECTIONS = frozenset({"configMap", "secret"})
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/pgpu")
#: set on each StatefulSet pod by its controller (the pod's ordinal), never in the template
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"


@dataclass(frozen=True)
class KubernetesType:
    """One of a policy's `extraKubernetesTypes`, matched exactly against an object's
    `apiVersion` and `kind` (as NVCF does: `core` is not an alias of the empty core group, and
    the parser refuses an empty group, so no core-group kind can be allowed)."""

    group: str
    version: str
    kind: str

    @property
    def key(self) -> tuple[str, str, str]:
        return self.group, self.version, self.kind


@dataclass(frozen=True)
class ValidationPolicy:
    """A deployment's `helmValidationPolicy`."""

    name: Literal["Default", "Unrestricted"] = "Default"
    extra_kubernetes_types: tuple[KubernetesType, ...] = ()

    @property
    def unrestricted(self) -> bool:
        return self.name == "Unrestricted"

    @property
    def operator_managed(self) -> bool:
        """Extra types may be operator-managed workloads (LeaderWorkerSet, Grove, Dynamo…)
        that create the inference Service and its pods themselves (as in NVCF)."""
        return bool(self.extra_kubernetes_types)


def type_key(obj: KubeObject) -> tuple[str, str, str]:
    api_version = str(obj.get("apiVersion") or "")
    group, _, version = api_version.rpartition("/")
    return group, version, str(obj.get("kind") or "")


def _type_label(key: tuple[str, str, str]) -> str:
    group, version, kind = key
    version, kind = version or "?", kind or "?"
    return f"{group}/{version}.{kind}" if group else f"{version}.{kind}"


def is_crd(obj: KubeObject) -> bool:
    group, _, kind = type_key(obj)
    return kind == "CustomResourceDefinition" and group == "apiextensions.k8s.io"


def restrict(
    objects: list[KubeObject],
    *,
    service_name: str | None,
    inference_port: int,
    policy: ValidationPolicy | None = None,
    enforce_security: bool = False,
    instance_type_nodes: int | None = None,
    gpus_per_node: int | None = None,
    nvlink: bool = False,
) -> tuple[list[KubeObject], list[Finding], list[str]]:
    """Check `objects`; return the objects to keep (CRDs dropped), findings, dropped CRDs.
    `service_name` None: no inference Service is looked for (a helm task serves none)."""
    policy = policy or ValidationPolicy()
    findings: list[Finding] = []
    crds = [object_ref(o) for o in objects if is_crd(o)]
    kept = [o for o in objects if not is_crd(o)]
    findings.extend(
        Finding(
            "crd-skipped",
            "warning",
            ref,
            None,
            "CustomResourceDefinitions are dropped and never installed",
        )
        for ref in crds
    )
    if len(kept) > MAX_OBJECTS:
        findings.append(
            Finding(
                "too-many-objects",
                "error",
                None,
                None,
                f"the chart renders {len(kept)} objects, more than the {MAX_OBJECTS} allowed",
            )
        )
    findings.extend(
        Finding("missing-name", "error", object_ref(o), "metadata.name", "object has no name")
        for o in kept
        if object_name(o) is None
    )
    if not policy.unrestricted:  # Unrestricted: no kind, Service type or volume rules
        findings.extend(_kinds(kept, policy))
        for obj in kept:
            findings.extend(_service_type(obj))
            findings.extend(_volumes(obj))
    for obj in kept:
        findings.extend(_images(obj))  # under every policy: a container needs an image
    if service_name is not None:
        findings.extend(
            _inference_service(kept, service_name, inference_port, policy.operator_managed)
        )
    if instance_type_nodes is not None and instance_type_nodes > 1:
        findings.extend(_multi_node(kept, instance_type_nodes, gpus_per_node, nvlink))
    if not policy.unrestricted:
        severity: Severity = "error" if enforce_security else "warning"
        for obj in kept:
            for path, template in pod_templates(obj):
                findings.extend(pod_security(object_ref(obj), path, template, severity))
                findings.extend(_resources(object_ref(obj), path, template, severity))
    return kept, findings, crds


def _kinds(objects: list[KubeObject], policy: ValidationPolicy) -> list[Finding]:
    allowed = ALLOWED_TYPES | {t.key for t in policy.extra_kubernetes_types}
    offending: list[str] = []
    core = False
    for obj in objects:
        key = type_key(obj)
        label = _type_label(key)
        if key not in allowed and label not in offending:
            offending.append(label)
            core = core or (not key[0] and all(key[1:]))  # a typed v1 kind
    if not offending:
        return []
    hint = (
        "add them to helmValidationPolicy.extraKubernetesTypes to allow them"
        if not core
        else "extraKubernetesTypes can allow kinds of a named API group; core-group (v1) kinds "
        "outside the allowed list cannot be allowed"
    )
    return [
        Finding(
            "kind-not-allowed",
            "error",
            None,
            "kind",
            "kinds not allowed: " + ", ".join(offending) + f" ({hint})",
        )
    ]


def _service_type(obj: KubeObject) -> list[Finding]:
    if not is_kind(obj, "v1", "Service"):
        return []
    spec = obj.get("spec")
    kind = spec.get("type") if isinstance(spec, dict) else None
    if kind in (None, "", "ClusterIP"):  # Kubernetes defaults an empty type to ClusterIP
        return []
    return [
        Finding(
            "service-type",
            "error",
            object_ref(obj),
            "spec.type",
            f"Service type {kind!r} is not allowed; only ClusterIP",
        )
    ]


def _volumes(obj: KubeObject) -> list[Finding]:
    out: list[Finding] = []
    for path, template in pod_templates(obj):
        volumes = template["spec"].get("volumes")
        if not isinstance(volumes, list):
            continue
        for i, volume in enumerate(volumes):
            if not isinstance(volume, dict):
                continue
            field = join(path, f"spec.volumes[{i}]")
            name = volume.get("name")
            for source in sorted(k for k in volume if k != "name"):
                if source not in ALLOWED_VOLUMES:
                    out.append(
                        Finding(
                            "volume-type",
                            "error",
                            object_ref(obj),
                            f"{field}.{source}",
                            f"volume {name!r}: {source} volumes are not allowed",
                        )
                    )
                elif source == "projected":
                    out.extend(_projections(obj, f"{field}.projected", name, volume[source]))
    return out


def _projections(obj: KubeObject, field: str, name: Any, projected: Any) -> list[Finding]:
    sources = projected.get("sources") if isinstance(projected, dict) else None
    out: list[Finding] = []
    for j, source in enumerate(sources if isinstance(sources, list) else []):
        for key in sorted(source if isinstance(source, dict) else {}):
            if key not in ALLOWED_PROJECTIONS:
                out.append(
                    Finding(
                        "volume-type",
                        "error",
                        object_ref(obj),
                        f"{field}.sources[{j}].{key}",
                        f"volume {name!r}: projected {key} sources are not allowed",
                    )
                )
    return out


def _images(obj: KubeObject) -> list[Finding]:
    """Every container needs an image (helm-reval refuses an empty one, as Kubernetes does)."""
    out: list[Finding] = []
    for path, template in pod_templates(obj):
        for list_key, i, container in containers(template["spec"]):
            image = container.get("image")
            if isinstance(image, str) and image.strip():
                continue
            out.append(
                Finding(
                    "container-image",
                    "error",
                    object_ref(obj),
                    join(path, f"spec.{list_key}[{i}].image"),
                    f"container {container.get('name')!r} has no image",
                )
            )
    return out


def _labels(template: dict[str, Any]) -> dict[str, Any]:
    labels = metadata(template).get("labels")
    return labels if isinstance(labels, dict) else {}


def _selects(selector: dict[str, Any], holder: KubeObject, template: dict[str, Any]) -> bool:
    """Whether a Service `selector` selects the pods of `template` (held by `holder`).

    The StatefulSet controller labels each pod with its ordinal (`POD_INDEX_LABEL`) at run
    time, so a selector on that label (NVIDIA's multi-node charts select pod 0, the leader)
    matches a StatefulSet's pods whatever its template says, as helm-reval decides.
    """
    labels = _labels(template)
    stateful = is_kind(holder, "apps/v1", "StatefulSet")
    for key, value in selector.items():
        if key == POD_INDEX_LABEL and value and stateful:
            continue
        if labels.get(key) != value:
            return False
    return True


def _port_matches(container: dict[str, Any], target: Any) -> bool:
    for port in items(container.get("ports")):
        if not isinstance(port, dict):
            continue
        if isinstance(target, int) and not isinstance(target, bool):
            if port.get("containerPort") == target:
                return True
        elif isinstance(target, str) and port.get("name") == target:
            return True
    return False


def _inference_service(
    objects: list[KubeObject], name: str, port: int, operator_managed: bool = False
) -> list[Finding]:
    """The inference Service: present (a warning only when the policy's extra types may be
    an operator-managed workload that creates it, as in NVCF), unique, with `port`, and
    served by a selected container (a warning when an operator may create the pods)."""
    services = [o for o in objects if is_kind(o, "v1", "Service") and object_name(o) == name]
    if not services:
        found = sorted(object_name(o) or "?" for o in objects if is_kind(o, "v1", "Service"))
        message = f"no Service named {name!r} among the rendered objects" + (
            f" (Services: {', '.join(found)})" if found else " (no Services)"
        )
        if operator_managed:
            message += (
                "; only a warning because helmValidationPolicy.extraKubernetesTypes may be an "
                "operator-managed workload (LeaderWorkerSet, Grove, Dynamo…) that creates it"
            )
        return [
            Finding(
                "service-not-found",
                "warning" if operator_managed else "error",
                None,
                "helmChartServiceName",
                message,
            )
        ]
    if len(services) > 1:
        return [
            Finding(
                "service-duplicate",
                "error",
                object_ref(services[1]),
                "metadata.name",
                f"{len(services)} Services are named {name!r}; the inference Service "
                "(helmChartServiceName) must be unique",
            )
        ]
    service = services[0]
    ref = object_ref(service)
    spec = service.get("spec") if isinstance(service.get("spec"), dict) else {}
    assert isinstance(spec, dict)
    ports = [p for p in items(spec.get("ports")) if isinstance(p, dict)]
    matching = [(i, p) for i, p in enumerate(ports) if p.get("port") == port]
    if not matching:
        listed = ", ".join(str(p.get("port")) for p in ports) or "none"
        return [
            Finding(
                "service-port",
                "error",
                ref,
                "spec.ports",
                f"Service {name!r} has no port {port} (ports: {listed})",
            )
        ]
    selector = spec.get("selector")
    if not isinstance(selector, dict) or not selector:
        return [
            Finding(
                "service-target",
                "warning" if operator_managed else "error",
                ref,
                "spec.selector",
                f"Service {name!r} has no selector, so no container serves port {port}",
            )
        ]
    selected = [
        template
        for obj in objects
        for _, template in pod_templates(obj)
        if _selects(selector, obj, template)
    ]
    for _, service_port in matching:
        target = service_port.get("targetPort", service_port.get("port"))
        for template in selected:
            app = items(template["spec"].get("containers"))
            if any(isinstance(c, dict) and _port_matches(c, target) for c in app):
                return []
    index, service_port = matching[0]
    target = service_port.get("targetPort", service_port.get("port"))
    why = (
        "no Pod or pod template matches its selector"
        if not selected
        else f"no selected container exposes port {target!r}"
    )
    if operator_managed:
        why += (
            "; only a warning because helmValidationPolicy.extraKubernetesTypes may be an "
            "operator-managed workload that creates the pods"
        )
    return [
        Finding(
            "service-target",
            "warning" if operator_managed else "error",
            ref,
            f"spec.ports[{index}].targetPort",
            f"Service {name!r} port {port} targets {target!r}, but {why}",
        )
    ]


def container_gpus(container: dict[str, Any]) -> int:
    resources = container.get("resources")
    if not isinstance(resources, dict):
        return 0
    best = 0
    for section in ("limits", "requests"):
        values = resources.get(section)
        if isinstance(values, dict):
            best = max(best, sum(whole_quantity(values.get(r, 0)) for r in GPU_RESOURCES))
    return best


def _multi_node(
    objects: list[KubeObject], nodes: int, gpus_per_node: int | None, nvlink: bool
) -> list[Finding]:
    severity: Severity = "error" if nvlink else "warning"
    out: list[Finding] = []
    gpu_pods = 0
    for obj in objects:
        for path, template in pod_templates(obj):
            app = [c for c in items(template["spec"].get("containers")) if isinstance(c, dict)]
            gpus = sum(container_gpus(c) for c in app)
            if gpus == 0:
                continue
            gpu_pods += replica_count(obj)
            if gpus_per_node is not None and gpus != gpus_per_node:
                out.append(
                    Finding(
                        "multi-node-full-node",
                        severity,
                        object_ref(obj),
                        join(path, "spec.containers"),
                        f"the pod requests {gpus} GPUs; on a multi-node instance type each GPU "
                        f"pod must request exactly the {gpus_per_node} GPUs of one node",
                    )
                )
    if gpu_pods > nodes:
        out.append(
            Finding(
                "multi-node-full-node",
                severity,
                None,
                None,
                f"the chart runs {gpu_pods} GPU pods but the instance type has {nodes} nodes",
            )
        )
    return out


def _resources(ref: str, path: str, template: dict[str, Any], severity: Severity) -> list[Finding]:
    out: list[Finding] = []
    for list_key, i, container in containers(template["spec"]):
        resources = container.get("resources")
        resources = resources if isinstance(resources, dict) else {}
        limits = resources.get("limits") if isinstance(resources.get("limits"), dict) else {}
        requests = resources.get("requests") if isinstance(resources.get("requests"), dict) else {}
        assert isinstance(limits, dict) and isinstance(requests, dict)
        missing = [k for k in ("cpu", "memory") if k not in limits]
        if "nvidia.com/gpu" in requests and "nvidia.com/gpu" not in limits:
            missing.append("nvidia.com/gpu")
        if missing:
            out.append(
                Finding(
                    "resources-limits",
                    severity,
                    ref,
                    join(path, f"spec.{list_key}[{i}].resources.limits"),
                    f"container {container.get('name')!r} has no limits for {', '.join(missing)}",
                )
            )
    return out
