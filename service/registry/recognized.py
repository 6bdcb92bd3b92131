"""Registries NVCF recognizes (`GET /recognized-registries`) and the `registryName` of a host.

The table is NVCF's production configuration of recognized registries: per artifact type, a
display name and a hostname. Some hostnames stand for a family of hosts, as in NVCF:
`dkr.ecr.amazonaws.com` for every private ECR registry (`<12-digit account>.dkr.ecr.<region>
.amazonaws.com`), `cr.volces.com` for Volcano Engine registries (`<name>-<region>.cr.volces.com`)
and `azurecr.io` for every Azure registry (`<name>.azurecr.io`).

Unlike NVCF, a self-hosted control plane also stores credentials for any other registry (an
in-cluster or corporate one): those are named `Custom Registry`.
"""

from __future__ import annotations

import re

from service.registry.hostnames import split_host_port
from service.registry.models import ArtifactType

NGC = "NGC Private Registry"
DOCKER_HUB = "Docker Hub Registry"
ECR_PRIVATE = "AWS ECR Private Registry"
ECR_PUBLIC = "AWS ECR Public Registry"
VOLCENGINE = "Volcano Engine Registry"
ACR = "Azure Container Registry"
CUSTOM = "Custom Registry"

ECR_PRIVATE_HOST = "dkr.ecr.amazonaws.com"
VOLCENGINE_HOST = "cr.volces.com"
ACR_HOST = "azurecr.io"

#: artifact type -> recognized registry name -> hostname (NVCF's `nvcf.registries.recognized`)
RECOGNIZED: dict[ArtifactType, dict[str, str]] = {
    ArtifactType.CONTAINER: {
        DOCKER_HUB: "docker.io",
        NGC: "nvcr.io",
        ECR_PRIVATE: ECR_PRIVATE_HOST,
        ECR_PUBLIC: "public.ecr.aws",
        VOLCENGINE: VOLCENGINE_HOST,
        ACR: ACR_HOST,
    },
    ArtifactType.HELM: {
        DOCKER_HUB: "docker.io",
        NGC: "helm.ngc.nvidia.com",
        ECR_PRIVATE: ECR_PRIVATE_HOST,
        ECR_PUBLIC: "public.ecr.aws",
        VOLCENGINE: VOLCENGINE_HOST,
        ACR: ACR_HOST,
    },
    ArtifactType.MODEL: {NGC: "api.ngc.nvidia.com"},
    ArtifactType.RESOURCE: {NGC: "api.ngc.nvidia.com"},
}

#: NGC's canary hostnames are aliases of the production ones (NVCF maps them the same way)
_CANARY = {
    "canary.nvcr.io": "nvcr.io",
    "helm.canary.ngc.nvidia.com": "helm.ngc.nvidia.com",
    "api.canary.ngc.nvidia.com": "api.ngc.nvidia.com",
}
_ECR_PRIVATE_RE = re.compile(r"^\d{12}\.dkr\.ecr\.[a-z]{2}(-[a-z]+)+-\d\.amazonaws\.com$")
_VOLCENGINE_REGIONS = (
    "cn-beijing",
    "cn-shanghai",
    "cn-guangzhou",
    "cn-hangzhou",
    "cn-hongkong",
    "ap-southeast-1",
    "ap-southeast-3",
)
_VOLCENGINE_RE = re.compile(
    r"^[\w-]+-(" + "|".join(map(re.escape, _VOLCENGINE_REGIONS)) + r")\.cr\.volces\.com$"
)

_NAMES: dict[str, str] = {
    host: name for registries in RECOGNIZED.values() for name, host in registries.items()
}


def recognized_hostname(hostname: str) -> str:
    """The hostname under which `hostname` (`host[:port]`, lower-case) is recognized."""
    host, _ = split_host_port(hostname)
    host = _CANARY.get(host, host)
    if _ECR_PRIVATE_RE.match(host):
        return ECR_PRIVATE_HOST
    if _VOLCENGINE_RE.match(host):
        return VOLCENGINE_HOST
    if host.endswith("." + ACR_HOST):
        return ACR_HOST
    return host


def registry_name(hostname: str) -> str:
    """`registryName` of a credential for `hostname`: its recognized registry, else Custom."""
    return _NAMES.get(recognized_hostname(hostname), CUSTOM)


def recognized_registries() -> dict[str, list[dict[str, str]]]:
    """The body of `GET /recognized-registries`: per artifact type, `{name, hostname}` items
    sorted by name, as NVCF lists them."""
    return {
        kind.value: [{"name": n, "hostname": h} for n, h in sorted(registries.items())]
        for kind, registries in RECOGNIZED.items()
    }


def is_ngc(hostname: str) -> bool:
    """NGC hosts (`nvcr.io`, `*.ngc.nvidia.com`) take only `$oauthtoken` logins (NVCF's rule)."""
    host, _ = split_host_port(hostname)
    return any(host == d or host.endswith("." + d) for d in ("nvcr.io", "ngc.nvidia.com"))
