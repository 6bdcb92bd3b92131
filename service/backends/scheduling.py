"""Pod specs read the way the Kubernetes scheduler reads them (GPU requests, node affinity):
the simulated cluster schedules with these, the real one computes free capacity with them.
The names they read (node label, GPU resource) are those of `service.core.kube`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from service.core.kube import GPU_RESOURCE
from service.core.quantities import whole_quantity


def _map(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _gpu_quantity(container: Mapping[str, Any]) -> int:
    resources = _map(container.get("resources"))
    for section in ("limits", "requests"):
        value = _map(resources.get(section)).get(GPU_RESOURCE)
        if value is not None:
            return whole_quantity(value)
    return 0


def gpu_request(pod_spec: Mapping[str, Any]) -> int:
    """GPUs a pod needs, as the scheduler computes it: max(sum of containers, largest init)."""
    main = sum(_gpu_quantity(_map(c)) for c in _list(pod_spec.get("containers")))
    init = max((_gpu_quantity(_map(c)) for c in _list(pod_spec.get("initContainers"))), default=0)
    return max(main, init)


def _expression_matches(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key = str(expr.get("key", ""))
    op = str(expr.get("operator", ""))
    values = [str(v) for v in _list(expr.get("values"))]
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt") and key in labels and values:
        try:
            have, want = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def node_affinity_matches(pod_spec: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """`nodeSelector` and required node affinity (terms ORed, expressions ANDed)."""
    selector = _map(pod_spec.get("nodeSelector"))
    if any(labels.get(str(k)) != str(v) for k, v in selector.items()):
        return False
    required = _map(
        _map(_map(pod_spec.get("affinity")).get("nodeAffinity")).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
    )
    terms = [_map(t) for t in _list(required.get("nodeSelectorTerms"))]
    if not terms:
        return True
    return any(
        all(_expression_matches(_map(e), labels) for e in _list(term.get("matchExpressions")))
        for term in terms
    )
