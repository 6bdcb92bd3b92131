"""The kinds the Kubernetes adapter knows: their API paths (a static table of the kinds the chart
pipeline allows, plus the NVLink `ComputeDomain`; other kinds get their plural the way
apimachinery guesses it and are assumed namespaced) and the order objects are applied in."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from lightkube.generic_resource import (
    GenericGlobalResource,
    GenericNamespacedResource,
    create_api_info,
)


@dataclass(frozen=True)
class KindInfo:
    """Where the API server serves one kind: group, version, plural and scope."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        """The REST path, e.g. `/apis/apps/v1/namespaces/sr-1/deployments/web`."""
        parts = ["/api", self.version] if not self.group else ["/apis", self.group, self.version]
        if self.namespaced and namespace is not None:
            parts += ["namespaces", namespace]
        parts.append(self.plural)
        if name is not None:
            parts.append(name)
        return "/".join(parts)


NAMESPACE = KindInfo("", "v1", "Namespace", "namespaces", namespaced=False)


NODE = KindInfo("", "v1", "Node", "nodes", namespaced=False)


EVENT = KindInfo("", "v1", "Event", "events")


POD = KindInfo("", "v1", "Pod", "pods")


SERVICE = KindInfo("", "v1", "Service", "services")


DEPLOYMENT = KindInfo("apps", "v1", "Deployment", "deployments")


REPLICA_SET = KindInfo("apps", "v1", "ReplicaSet", "replicasets")


STATEFUL_SET = KindInfo("apps", "v1", "StatefulSet", "statefulsets")


JOB = KindInfo("batch", "v1", "Job", "jobs")


COMPUTE_DOMAIN = KindInfo("resource.nvidia.com", "v1beta1", "ComputeDomain", "computedomains")


KNOWN_KINDS: tuple[KindInfo, ...] = (
    NAMESPACE,
    NODE,
    EVENT,
    POD,
    SERVICE,
    KindInfo("", "v1", "ConfigMap", "configmaps"),
    KindInfo("", "v1", "Secret", "secrets"),
    KindInfo("", "v1", "ServiceAccount", "serviceaccounts"),
    KindInfo("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims"),
    DEPLOYMENT,
    REPLICA_SET,
    STATEFUL_SET,
    JOB,
    KindInfo("batch", "v1", "CronJob", "cronjobs"),
    KindInfo("rbac.authorization.k8s.io", "v1", "Role", "roles"),
    KindInfo("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings"),
    COMPUTE_DOMAIN,
)


_BY_TYPE = {(k.api_version, k.kind): k for k in KNOWN_KINDS}


# What `observe` always lists: pods and the controllers the health machine reads.
OBSERVED_KINDS: tuple[KindInfo, ...] = (POD, DEPLOYMENT, REPLICA_SET, STATEFUL_SET, JOB)


# Apply order: what others refer to first (helm's install order, simplified).
_APPLY_ORDER: dict[tuple[str, str], int] = {
    ("v1", "Namespace"): 0,
    ("v1", "Secret"): 1,
    ("v1", "ConfigMap"): 2,
    ("v1", "ServiceAccount"): 3,
    ("rbac.authorization.k8s.io/v1", "Role"): 4,
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): 5,
    ("v1", "PersistentVolumeClaim"): 6,
    ("v1", "Service"): 7,
    ("v1", "Pod"): 8,
    ("apps/v1", "Deployment"): 8,
    ("apps/v1", "ReplicaSet"): 8,
    ("apps/v1", "StatefulSet"): 8,
    ("batch/v1", "Job"): 8,
    ("batch/v1", "CronJob"): 8,
}


_LAST = 9


def guess_plural(kind: str) -> str:
    """apimachinery's `UnsafeGuessKindToResource`: `Widget` -> `widgets`, `Policy` -> `policies`."""
    lower = kind.lower()
    if lower.endswith("s"):
        return lower + "es"
    if lower.endswith("y"):
        return lower[:-1] + "ies"
    return lower + "s"


def kind_info(api_version: str, kind: str) -> KindInfo:
    """The table entry for a kind, or a namespaced guess for kinds outside the table."""
    known = _BY_TYPE.get((api_version, kind))
    if known is not None:
        return known
    group, _, version = api_version.rpartition("/")
    return KindInfo(group, version, kind, guess_plural(kind))


def apply_rank(api_version: str, kind: str) -> int:
    """Position of a kind in the apply order (lower first)."""
    return _APPLY_ORDER.get((api_version, kind), _LAST)


@cache
def namespaced_resource(info: KindInfo) -> type[GenericNamespacedResource]:
    # Built directly rather than through `create_namespaced_resource`, which would register
    # these generic classes in lightkube's process-wide registry in place of its typed models.
    api = create_api_info(info.group, info.version, info.kind, info.plural)
    return type(info.kind, (GenericNamespacedResource,), {"_api_info": api})


@cache
def global_resource(info: KindInfo) -> type[GenericGlobalResource]:
    api = create_api_info(info.group, info.version, info.kind, info.plural)
    return type(info.kind, (GenericGlobalResource,), {"_api_info": api})
