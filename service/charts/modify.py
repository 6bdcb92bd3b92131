"""Automatic modifications of pod specs (helm.md §3.2), each reported as an `info` finding.

Only changes that cannot break a chart: scheduling and service-account settings the platform
owns are removed, and safe security defaults are filled in where the chart left them unset.
"""

from __future__ import annotations

import copy
from typing import Any

from service.charts.findings import Finding, KubeObject, containers, join, object_ref, pod_templates

RULE = "modified"
REMOVED_POD_FIELDS = (
    "nodeSelector",
    "nodeName",
    "priorityClassName",
    "serviceAccountName",
    "serviceAccount",
)


def apply_modifications(objects: list[KubeObject]) -> tuple[list[KubeObject], list[Finding]]:
    """Return `objects` with modified copies of those holding pod specs, and one `info`
    finding per change. The input is never mutated; objects without pod specs are returned
    as they are (not copied)."""
    out: list[KubeObject] = []
    findings: list[Finding] = []
    for original in objects:
        if next(pod_templates(original), None) is None:
            out.append(original)
            continue
        obj = copy.deepcopy(original)
        ref = object_ref(obj)
        for path, template in pod_templates(obj):
            findings.extend(_modify_pod(ref, join(path, "spec"), template["spec"]))
        out.append(obj)
    return out, findings


def _modify_pod(ref: str, sp: str, spec: dict[str, Any]) -> list[Finding]:
    findings: list[Finding] = []

    def note(field: str, message: str) -> None:
        findings.append(Finding(RULE, "info", ref, field, message))

    for key in REMOVED_POD_FIELDS:
        if key in spec:
            del spec[key]
            note(f"{sp}.{key}", f"removed {key}: scheduling and service accounts are managed")
    affinity = spec.get("affinity")
    if isinstance(affinity, dict) and "nodeAffinity" in affinity:
        del affinity["nodeAffinity"]
        if not affinity:
            del spec["affinity"]
        note(f"{sp}.affinity.nodeAffinity", "removed node affinity: node placement is managed")
    if spec.get("automountServiceAccountToken") is None:
        spec["automountServiceAccountToken"] = False
        note(f"{sp}.automountServiceAccountToken", "set automountServiceAccountToken to false")
    for list_key, i, container in containers(spec):
        sc = container.get("securityContext")
        if not isinstance(sc, dict) or sc.get("allowPrivilegeEscalation") is not None:
            continue
        caps = sc.get("capabilities")
        added = caps.get("add") if isinstance(caps, dict) else None
        if sc.get("privileged") is True or "SYS_ADMIN" in (added or []):
            continue
        sc["allowPrivilegeEscalation"] = False
        note(
            f"{sp}.{list_key}[{i}].securityContext.allowPrivilegeEscalation",
            f"container {container.get('name')!r}: set allowPrivilegeEscalation to false",
        )
    return findings
