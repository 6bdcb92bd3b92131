"""What the Kubernetes adapter applies: each object checked and made ready to apply into the
instance's namespace, and the namespace itself, labelled with the instance's ids and recording
which objects were applied (the `nvcf.nvidia.com/applied-objects` annotation), so that
`observe` knows what should exist even after a restart of the service."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

from service.backends.kubernetes.capacity import as_map
from service.backends.kubernetes.kinds import KindInfo, kind_info
from service.backends.protocol import (
    AdapterError,
    InstanceSpec,
    check_namespace,
    object_metadata,
)
from service.core.kube import (
    LABEL_FUNCTION_ID,
    LABEL_INSTANCE_ID,
    LABEL_NCA_ID,
    LABEL_VERSION_ID,
    MANAGED_BY_LABEL,
)

APPLIED_ANNOTATION = "nvcf.nvidia.com/applied-objects"


def prepare(instance: InstanceSpec, obj: Any) -> tuple[KindInfo, dict[str, Any]]:
    """Check one object and return its kind and the body to apply (a copy)."""
    object_metadata(obj)
    info = kind_info(str(obj["apiVersion"]), str(obj["kind"]))
    body = copy.deepcopy(obj)
    metadata = body["metadata"]
    if not info.namespaced:
        raise AdapterError(
            f"{info.kind}/{metadata['name']} is cluster-scoped; only namespaced objects are "
            f"installed into {instance.namespace}",
            retryable=False,
        )
    check_namespace(instance, metadata)
    metadata["namespace"] = instance.namespace
    for server_field in ("resourceVersion", "uid", "managedFields", "creationTimestamp"):
        metadata.pop(server_field, None)
    body.pop("status", None)
    return info, body


def namespace_body(
    instance: InstanceSpec,
    prepared: Sequence[tuple[KindInfo, dict[str, Any]]],
    field_manager: str,
) -> dict[str, Any]:
    """The instance's namespace, with its labels and the record of the objects applied."""
    applied = sorted(
        {(info.api_version, info.kind, str(body["metadata"]["name"])) for info, body in prepared}
    )
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": instance.namespace,
            "labels": {
                MANAGED_BY_LABEL: field_manager,
                LABEL_FUNCTION_ID: instance.function_id,
                LABEL_VERSION_ID: instance.version_id,
                LABEL_INSTANCE_ID: instance.instance_id,
                LABEL_NCA_ID: instance.nca_id,
            },
            "annotations": {
                APPLIED_ANNOTATION: json.dumps([list(a) for a in applied], separators=(",", ":"))
            },
        },
    }


def applied(namespace: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """The `(apiVersion, kind, name)` triples recorded on the namespace by `apply`."""
    annotations = as_map(as_map(namespace.get("metadata")).get("annotations"))
    try:
        entries = json.loads(str(annotations.get(APPLIED_ANNOTATION) or "[]"))
    except ValueError:
        return []
    out: list[tuple[str, str, str]] = []
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, list) and len(entry) == 3 and all(isinstance(e, str) for e in entry):
            out.append((entry[0], entry[1], entry[2]))
    return out


def terminating(namespace: Mapping[str, Any]) -> bool:
    metadata = as_map(namespace.get("metadata"))
    phase = as_map(namespace.get("status")).get("phase")
    return metadata.get("deletionTimestamp") is not None or phase == "Terminating"
