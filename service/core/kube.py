"""The Kubernetes naming contract of the platform, written once.

Every name the control plane puts on, or reads from, a cluster: the instance namespace, the
labels and annotations of instance objects, the node labels and GPU resource names the
scheduler and capacity reads rely on, the NVLink cluster attribute and Helm's hook annotation.
Both adapters, the install-time mutations, the chart pipeline and the reconciler use these
names; none of them spells one itself. Pure constants and functions: imports nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

#: each instance lives in its own namespace `sr-<instanceId>` (helm.md §5)
NAMESPACE_PREFIX = "sr-"

# labels the mutations put on every object of an instance (and the adapters select by)
LABEL_FUNCTION_ID = "nvcf.nvidia.com/function-id"
LABEL_VERSION_ID = "nvcf.nvidia.com/function-version-id"
LABEL_INSTANCE_ID = "nvcf.nvidia.com/instance-id"
LABEL_NCA_ID = "nvcf.nvidia.com/nca-id"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
# annotations the mutations add for the people reading the cluster
ANNOTATION_FUNCTION_NAME = "nvcf.nvidia.com/function-name"
ANNOTATION_INSTANCE_TYPE = "nvcf.nvidia.com/instance-type"
ANNOTATION_BACKEND = "nvcf.nvidia.com/backend"
ANNOTATION_REGION = "nvcf.nvidia.com/region"

#: node label a cluster agent puts on GPU nodes: `<CSP>.GPU.<GPU>` (no `_<N>x` suffix)
INSTANCE_TYPE_LABEL = "nvca.nvcf.nvidia.io/instance-type"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"


def instance_type_label(csp: str, gpu: str) -> str:
    """The `INSTANCE_TYPE_LABEL` value of a node with `gpu` GPUs at `csp`: `NCP.GPU.H100`."""
    return f"{csp}.GPU.{gpu}"


#: node label of the NVLink domain (GPU clique) on NVLink-optimised clusters
CLIQUE_LABEL = "nvidia.com/gpu.clique"
#: the resource pods request GPUs by (what schedulers and capacity reads count)
GPU_RESOURCE = "nvidia.com/gpu"

#: the cluster attribute that turns on the NVLink (ComputeDomain) mutations
NVLINK_ATTRIBUTE = "NVLinkOptimized"
#: attributes with a meaning to the platform, by their case-insensitive spelling
KNOWN_ATTRIBUTES = {NVLINK_ATTRIBUTE.lower(): NVLINK_ATTRIBUTE}

# the version's secrets in every pod of an instance: the Secret `nvcf-secrets` of the instance
# namespace, key `secrets.json` (`{name: value}`), mounted read-only at /var/secrets, the path
# NVCF's workers read (`/var/secrets/secrets.json`)
SECRETS_OBJECT = "nvcf-secrets"
SECRETS_VOLUME = "nvcf-secrets"
SECRETS_DIR = "/var/secrets"
SECRETS_FILE = "secrets.json"

#: Helm treats a rendered object carrying this annotation as a hook, not a release object
HOOK_ANNOTATION = "helm.sh/hook"


def instance_namespace(instance_id: str) -> str:
    """The namespace of one instance (helm.md §5)."""
    return f"{NAMESPACE_PREFIX}{instance_id}"


def namespace_instance_id(namespace: str) -> str | None:
    """The instance id of an instance namespace, None for any other namespace."""
    if not namespace.startswith(NAMESPACE_PREFIX):
        return None
    return namespace[len(NAMESPACE_PREFIX) :]


def normalize_attributes(attributes: Iterable[str]) -> list[str]:
    """Catalog attributes as stored: known ones in their canonical spelling, no repeats
    (compared case-insensitively), order kept."""
    seen: dict[str, str] = {}
    for attribute in attributes:
        key = attribute.lower()
        seen.setdefault(key, KNOWN_ATTRIBUTES.get(key, attribute))
    return list(seen.values())


def has_attribute(attributes: Iterable[str], wanted: str) -> bool:
    """Whether `attributes` holds `wanted`, compared case-insensitively as everywhere."""
    key = wanted.lower()
    return any(a.lower() == key for a in attributes)


def is_nvlink(attributes: Iterable[str]) -> bool:
    return has_attribute(attributes, NVLINK_ATTRIBUTE)
