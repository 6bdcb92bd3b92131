"""Chart pipeline findings, the pipeline result, and helpers that address objects and pods."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

Severity = Literal["error", "warning", "info"]

#: A rendered Kubernetes object as decoded from the manifest (JSON-compatible).
KubeObject = dict[str, Any]


@dataclass(frozen=True)
class Finding:
    """One violation, notice or modification, addressed by object and field path."""

    rule: str
    severity: Severity
    object: str | None
    field: str | None
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "severity": self.severity,
            "object": self.object,
            "field": self.field,
            "message": self.message,
        }


@dataclass
class PipelineResult:
    """Everything the chart pipeline produced for one render."""

    errors: list[Finding] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)
    info: list[Finding] = field(default_factory=list)
    objects: list[KubeObject] = field(default_factory=list)
    workload_config: dict[str, bool] = field(default_factory=dict)
    hooks_skipped: list[str] = field(default_factory=list)
    crds_skipped: list[str] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return not self.errors

    @property
    def findings(self) -> list[Finding]:
        return [*self.errors, *self.warnings, *self.info]

    def add(self, *findings: Finding) -> None:
        for f in findings:
            bucket = {"error": self.errors, "warning": self.warnings, "info": self.info}
            bucket[f.severity].append(f)

    def as_dict(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "errors": [f.as_dict() for f in self.errors],
            "warnings": [f.as_dict() for f in self.warnings],
            "info": [f.as_dict() for f in self.info],
            "workloadConfig": dict(self.workload_config),
            "objects": self.objects,
            "hooksSkipped": list(self.hooks_skipped),
            "crdsSkipped": list(self.crds_skipped),
        }


def metadata(obj: KubeObject) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def object_name(obj: KubeObject) -> str | None:
    name = metadata(obj).get("name")
    return name if isinstance(name, str) and name else None


def object_ref(obj: KubeObject) -> str:
    """`<apiVersion>/<kind>/<name>` as findings name objects."""
    api_version = obj.get("apiVersion") or "?"
    kind = obj.get("kind") or "?"
    return f"{api_version}/{kind}/{object_name(obj) or '?'}"


def is_kind(obj: KubeObject, api_version: str, kind: str) -> bool:
    return obj.get("apiVersion") == api_version and obj.get("kind") == kind


def _dict_at(obj: Any, *keys: str) -> dict[str, Any] | None:
    for key in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj if isinstance(obj, dict) else None


def pod_templates(obj: KubeObject) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield `(path, template)` for each pod spec holder in `obj`.

    `template` is the live dict holding `metadata` and `spec` (the object itself for a Pod);
    `path` is its field path ("" for a Pod), so `f"{path}.spec"` addresses the pod spec.
    """
    kind = obj.get("kind")
    if kind == "Pod":
        if isinstance(obj.get("spec"), dict):
            yield "", obj
        return
    if kind == "CronJob":
        template = _dict_at(obj, "spec", "jobTemplate", "spec", "template")
        path = "spec.jobTemplate.spec.template"
    else:
        template = _dict_at(obj, "spec", "template")
        path = "spec.template"
    if template is not None and isinstance(template.get("spec"), dict):
        yield path, template


def items(value: Any) -> list[Any]:
    """A list field as rendered, or nothing when the chart put something else there."""
    return value if isinstance(value, list) else []


def join(path: str, suffix: str) -> str:
    return f"{path}.{suffix}" if path else suffix


def containers(pod_spec: dict[str, Any]) -> Iterator[tuple[str, int, dict[str, Any]]]:
    """Yield `(list key, index, container)` for init and app containers."""
    for key in ("initContainers", "containers"):
        items = pod_spec.get(key)
        if isinstance(items, list):
            for i, container in enumerate(items):
                if isinstance(container, dict):
                    yield key, i, container


def replica_count(obj: KubeObject) -> int:
    """How many pods a pod holder runs at most at once (1 for a Pod)."""
    kind = obj.get("kind")
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    assert isinstance(spec, dict)
    if kind == "CronJob":
        spec = _dict_at(spec, "jobTemplate", "spec") or {}
        kind = "Job"
    key = "parallelism" if kind == "Job" else "replicas"
    if kind == "Pod":
        return 1
    value = spec.get(key, 1)
    return value if isinstance(value, int) and not isinstance(value, bool) else 1
