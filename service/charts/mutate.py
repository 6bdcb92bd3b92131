"""Install-time mutations (helm.md §5): what the backend receives for one instance.

A pure function over object dicts: the input is never modified. Besides the labels and
annotations of §5 on every object, the same labels go on pod templates so the instance's
pods carry them, and every object is placed in the instance namespace.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from service.charts.findings import KubeObject, containers, object_name, pod_templates
from service.core.jsoncopy import copy_json
from service.core.kube import (
    ANNOTATION_BACKEND,
    ANNOTATION_FUNCTION_NAME,
    ANNOTATION_INSTANCE_TYPE,
    ANNOTATION_REGION,
    CLIQUE_LABEL,
    GPU_RESOURCE,
    INSTANCE_TYPE_LABEL,
    LABEL_FUNCTION_ID,
    LABEL_INSTANCE_ID,
    LABEL_NCA_ID,
    LABEL_VERSION_ID,
    SECRETS_DIR,
    SECRETS_FILE,
    SECRETS_OBJECT,
    SECRETS_VOLUME,
)

NVLINK_INDEX_ANNOTATION = "dra.nvcf.nvidia.io/required-nvlink-domain-index"
NVLINK_PARTITION_LABEL = "dra.nvcf.nvidia.io/nvlink-domain-partition"
COMPUTE_DOMAIN = "nvcf-cd-index-0"
CLAIM_TEMPLATE = "nvcf-cd-channel-0"
CLAIMED_RESOURCES = (GPU_RESOURCE, "nvidia.com/pgpu", "nvidia.com/gpu.shared")
CLAIMED_PREFIX = "nvidia.com/mig-"

_SUFFIX = re.compile(r"_[0-9]+x(?:\.x([0-9]+))?$")


def instance_type_base(instance_type: str) -> str:
    """`ON-PREM.GPU.B200_8x.x2` -> `ON-PREM.GPU.B200` (the node label value)."""
    return _SUFFIX.sub("", instance_type)


def instance_type_nodes(instance_type: str) -> int:
    match = _SUFFIX.search(instance_type)
    return int(match.group(1)) if match and match.group(1) else 1


def partition_label(namespace: str, index: str | None) -> str:
    digest = hashlib.sha256((namespace + (index or "")).encode()).hexdigest()
    return f"x{digest[:18]}x"


def _dict(parent: dict[str, Any], key: str) -> dict[str, Any]:
    value = parent.get(key)
    if not isinstance(value, dict):
        value = {}
        parent[key] = value
    return value


def _list(parent: dict[str, Any], key: str) -> list[Any]:
    value = parent.get(key)
    if not isinstance(value, list):
        value = []
        parent[key] = value
    return value


def _requests_gpu(container: dict[str, Any]) -> bool:
    resources = container.get("resources")
    if not isinstance(resources, dict):
        return False
    for section in ("limits", "requests"):
        values = resources.get(section)
        if isinstance(values, dict):
            for name in values:
                if name in CLAIMED_RESOURCES or str(name).startswith(CLAIMED_PREFIX):
                    return True
    return False


def secrets_object(secrets: Mapping[str, str]) -> KubeObject:
    """The Secret holding the version's secrets as `secrets.json` (`{name: value}`)."""
    content = json.dumps(dict(sorted(secrets.items())), separators=(",", ":"))
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRETS_OBJECT},
        "type": "Opaque",
        "data": {SECRETS_FILE: base64.b64encode(content.encode()).decode()},
    }


def _mount_secrets(spec: dict[str, Any]) -> None:
    """Every container and init container reads the Secret at /var/secrets (read-only);
    a volume of the same name or another mount at that path is replaced, as NVCF's own
    mutation drops the reserved ones first."""
    volumes = [
        v
        for v in spec.get("volumes") or []
        if not (isinstance(v, dict) and v.get("name") == SECRETS_VOLUME)
    ]
    volumes.append({"name": SECRETS_VOLUME, "secret": {"secretName": SECRETS_OBJECT}})
    spec["volumes"] = volumes
    for _, _, container in containers(spec):
        mounts = [
            m
            for m in container.get("volumeMounts") or []
            if not (
                isinstance(m, dict)
                and (
                    m.get("name") == SECRETS_VOLUME
                    or str(m.get("mountPath", "")).rstrip("/") == SECRETS_DIR
                )
            )
        ]
        mounts.append({"name": SECRETS_VOLUME, "mountPath": SECRETS_DIR, "readOnly": True})
        container["volumeMounts"] = mounts


def mutate_for_install(
    objects: Sequence[KubeObject],
    *,
    namespace: str,
    instance_id: str,
    function_id: str,
    version_id: str,
    function_name: str,
    nca_id: str,
    instance_type: str,
    backend: str,
    region: str,
    pull_secrets: Sequence[tuple[str, Mapping[str, Any]]] = (),
    nvlink: bool = False,
    secrets: Mapping[str, str] | None = None,
) -> list[KubeObject]:
    """The objects to install for one instance: generated Secrets (and ComputeDomain) first.

    With `secrets` (the version's, possibly none), the Secret `nvcf-secrets` is created and
    mounted at /var/secrets in every container of every pod template."""
    labels = {
        LABEL_FUNCTION_ID: function_id,
        LABEL_VERSION_ID: version_id,
        LABEL_INSTANCE_ID: instance_id,
        LABEL_NCA_ID: nca_id,
    }
    annotations = {
        ANNOTATION_FUNCTION_NAME: function_name,
        ANNOTATION_INSTANCE_TYPE: instance_type,
        ANNOTATION_BACKEND: backend,
        ANNOTATION_REGION: region,
    }
    env = [
        {"name": "NVCF_FUNCTION_ID", "value": function_id},
        {"name": "NVCF_FUNCTION_VERSION_ID", "value": version_id},
        {"name": "NVCF_FUNCTION_NAME", "value": function_name},
        {"name": "NVCF_NCA_ID", "value": nca_id},
        {"name": "NVCF_INSTANCETYPE", "value": instance_type},
        {"name": "NVCF_BACKEND", "value": backend},
        {"name": "NVCF_REGION", "value": region},
    ]
    generated: list[KubeObject] = []
    secret_names: list[str] = []
    for name, config in pull_secrets:
        secret_names.append(name)
        encoded = base64.b64encode(json.dumps(dict(config)).encode()).decode()
        generated.append(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": name},
                "type": "kubernetes.io/dockerconfigjson",
                "data": {".dockerconfigjson": encoded},
            }
        )
    if secrets is not None:
        generated.append(secrets_object(secrets))
    if nvlink:
        generated.append(
            {
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "ComputeDomain",
                "metadata": {"name": COMPUTE_DOMAIN},
                "spec": {
                    "numNodes": instance_type_nodes(instance_type),
                    "channel": {"resourceClaimTemplate": {"name": CLAIM_TEMPLATE}},
                },
            }
        )

    given = copy_json(list(objects))
    if secrets is not None:  # the platform's Secret of that name wins over the chart's
        given = [
            o for o in given if not (o.get("kind") == "Secret" and object_name(o) == SECRETS_OBJECT)
        ]
    out: list[KubeObject] = []
    for obj in [*generated, *given]:
        meta = _dict(obj, "metadata")
        meta["namespace"] = namespace
        _dict(meta, "labels").update(labels)
        _dict(meta, "annotations").update(annotations)
        for _, template in pod_templates(obj):
            _mutate_pod(
                template,
                namespace=namespace,
                labels=labels,
                env=env,
                secret_names=secret_names,
                node_label=instance_type_base(instance_type),
                nvlink=nvlink,
            )
            if secrets is not None:
                _mount_secrets(template["spec"])
        out.append(obj)
    return out


def _mutate_pod(
    template: dict[str, Any],
    *,
    namespace: str,
    labels: dict[str, str],
    env: list[dict[str, str]],
    secret_names: list[str],
    node_label: str,
    nvlink: bool,
) -> None:
    meta = _dict(template, "metadata")
    pod_labels = _dict(meta, "labels")
    pod_labels.update(labels)
    spec: dict[str, Any] = template["spec"]

    existing = {
        s["name"] for s in spec.get("imagePullSecrets") or [] if isinstance(s, dict) and "name" in s
    }
    spec["imagePullSecrets"] = [{"name": n} for n in sorted(existing | set(secret_names))]

    names = {e["name"] for e in env}
    claim = False
    for _, _, container in containers(spec):
        kept = [
            e
            for e in container.get("env") or []
            if not (isinstance(e, dict) and e.get("name") in names)
        ]
        container["env"] = kept + copy_json(env)
        if nvlink and _requests_gpu(container):
            claims = _list(_dict(container, "resources"), "claims")
            if not any(isinstance(c, dict) and c.get("name") == COMPUTE_DOMAIN for c in claims):
                claims.append({"name": COMPUTE_DOMAIN})
            claim = True

    node_expressions: list[dict[str, Any]] = [
        {"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": [node_label]}
    ]
    if nvlink:
        node_expressions.append({"key": CLIQUE_LABEL, "operator": "Exists"})
    affinity = _dict(spec, "affinity")
    required = _dict(
        _dict(affinity, "nodeAffinity"), "requiredDuringSchedulingIgnoredDuringExecution"
    )
    terms = [t for t in required.get("nodeSelectorTerms") or [] if isinstance(t, dict)] or [{}]
    for term in terms:
        _list(term, "matchExpressions").extend(copy_json(node_expressions))
    required["nodeSelectorTerms"] = terms

    if not nvlink:
        return
    annotations = meta.get("annotations") if isinstance(meta.get("annotations"), dict) else {}
    assert isinstance(annotations, dict)
    index = annotations.get(NVLINK_INDEX_ANNOTATION)
    partition = partition_label(namespace, None if index is None else str(index))
    pod_labels[NVLINK_PARTITION_LABEL] = partition
    term = {
        "labelSelector": {
            "matchExpressions": [
                {"key": NVLINK_PARTITION_LABEL, "operator": "In", "values": [partition]}
            ]
        },
        "topologyKey": CLIQUE_LABEL,
    }
    pod_affinity = _dict(affinity, "podAffinity")
    if index is not None:
        _list(pod_affinity, "requiredDuringSchedulingIgnoredDuringExecution").append(term)
    else:
        _list(pod_affinity, "preferredDuringSchedulingIgnoredDuringExecution").append(
            {"weight": 100, "podAffinityTerm": term}
        )
    if claim:
        claims = _list(spec, "resourceClaims")
        if not any(isinstance(c, dict) and c.get("name") == COMPUTE_DOMAIN for c in claims):
            claims.append({"name": COMPUTE_DOMAIN, "resourceClaimTemplateName": CLAIM_TEMPLATE})
