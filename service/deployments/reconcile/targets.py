"""What a backend receives for one instance: its `InstanceSpec` and its install-time-mutated
objects (helm.md §5: with the version's secrets as the Secret `nvcf-secrets` mounted at
/var/secrets), and the health mode its deployment asks for."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.backends.protocol import InstanceSpec
from service.charts.mutate import mutate_for_install
from service.clusters.catalog import Catalog
from service.clusters.instance_types import InstanceTypeError, parse_instance_type
from service.core.crypto import SecretBox
from service.core.kube import SECRETS_OBJECT, instance_namespace, is_nvlink
from service.deployments.models import Deployment, DeploymentSpec, Instance
from service.deployments.workload import DEFAULT_PORT
from service.functions.models import FunctionVersion
from service.functions.secret_values import versions_secrets
from service.functions.validation import utils_image
from service.health.machine import HealthMode


def health_mode(deployment: Deployment) -> HealthMode:
    if (deployment.feature_flags or {}).get("StatusByWorkerReadiness"):
        return "StatusByWorkerReadiness"
    return "default"


def instance_spec(
    dep: Deployment, version: FunctionVersion | None, row: Instance, spec: DeploymentSpec
) -> InstanceSpec:
    try:
        it = parse_instance_type(spec.instance_type)
    except InstanceTypeError:
        it = None
    return InstanceSpec(
        instance_id=str(row.id),
        function_id=str(dep.function_id),
        version_id=str(dep.version_id),
        instance_type=spec.instance_type,
        gpu=it.gpu if it else spec.gpu,
        gpus_per_node=it.gpus_per_node if it else 1,
        nodes=it.nodes if it else 1,
        cluster=row.cluster or "",
        deployment_id=str(dep.id),
        nca_id=dep.account_id,
        worker_service=version.helm_chart_service_name if version else None,
        worker_port=http_port(version),
        utils_image=utils_image(version.utils_container_image) if version else None,
    )


def http_port(version: FunctionVersion | None) -> int | None:
    """The inference port of an HTTP function; None for a gRPC one (inferenceUrl /gRPC)."""
    if version is None or version.inference_url.strip("/").lower() == "grpc":
        return None
    return version.inference_port or DEFAULT_PORT


def install_objects(
    catalog: Catalog,
    dep: Deployment,
    row: Instance,
    spec: DeploymentSpec,
    pull_secrets: Sequence[tuple[str, Mapping[str, Any]]],
    secrets: Mapping[str, str] | None = None,
    *,
    objects: Sequence[Any] | None = None,
) -> list[dict[str, Any]]:
    """The instance's objects after install-time mutation: `objects` (those of the revision it
    runs) or, by default, the spec's (its target revision)."""
    cluster = catalog.cluster(row.cluster or "")
    return mutate_for_install(
        [o for o in (spec.objects if objects is None else objects) if isinstance(o, dict)],
        namespace=instance_namespace(str(row.id)),
        instance_id=str(row.id),
        function_id=str(dep.function_id),
        version_id=str(dep.version_id),
        function_name=dep.function_name,
        nca_id=dep.account_id,
        instance_type=spec.instance_type,
        backend=spec.backend,
        region=cluster.region if cluster else "",
        pull_secrets=pull_secrets,
        nvlink=cluster is not None and is_nvlink(cluster.attributes),
        secrets=secrets if secrets is not None else {},
    )


def secrets_objects(objects: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Of an instance's install objects, the Secret holding the version's secrets."""
    return [
        o for o in objects if o.get("kind") == "Secret" and o["metadata"]["name"] == SECRETS_OBJECT
    ]


class VersionSecrets:
    """The versions' secrets (generation, plaintext), read at most once per unit of work;
    without a secrets key, none (generation None: nothing is recorded as delivered)."""

    def __init__(
        self, sessionmaker: async_sessionmaker[AsyncSession], box: SecretBox | None
    ) -> None:
        self._sessionmaker = sessionmaker
        self._box = box
        self._read: dict[uuid.UUID, tuple[int, dict[str, str]]] = {}

    async def prefetch(self, version_ids: Sequence[uuid.UUID]) -> None:
        """Read the secrets of every version a unit will need at once (no query per version)."""
        missing = [v for v in dict.fromkeys(version_ids) if v not in self._read]
        if self._box is None or not missing:
            return
        async with self._sessionmaker() as session:
            found = await versions_secrets(session, missing, self._box)
        for version_id in missing:
            self._read[version_id] = found.get(version_id, (0, {}))

    async def get(self, version_id: uuid.UUID) -> tuple[int | None, dict[str, str]]:
        if self._box is None:
            return None, {}
        await self.prefetch([version_id])
        return self._read[version_id]
