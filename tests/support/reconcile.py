"""The reconciler test harness: one database, a catalog of simulated clusters on a fake clock,
and builders for the Kubernetes objects a deployment specification carries."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.backends.protocol import InstanceSpec
from service.backends.simulated.adapter import SimulatedAdapter
from service.clusters.adapters import AdapterRegistry
from service.clusters.catalog import Catalog
from service.core.crypto import SecretBox
from service.deployments.models import Deployment, DeploymentEvent, DeploymentSpec, Instance
from service.deployments.reconcile import OwnerId, Reconciler, ReconcilerConfig
from service.functions.models import Function, FunctionVersion
from service.health.machine import HealthTimeouts

T0 = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
ACCOUNT = "acct-test"
TIMEOUTS = HealthTimeouts(
    pod_scheduling=20,
    image_pull=10,
    restart_loop=30,
    init=100,
    worker_startup=30,
    worker_degradation=10,
    pending=500,
    failing_backoff=10,
    failing_recheck=5,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def catalog_data(
    *, h100_nodes: int = 4, extra_clusters: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {
        "clusterGroups": [
            {
                "name": "test-group",
                "clusters": [
                    {
                        "name": "sim-a",
                        "adapter": "simulated",
                        "provider": "NCP",
                        "region": "us-east-1",
                        "nodes": [{"gpu": "H100", "gpusPerNode": 8, "count": h100_nodes}],
                        "simulation": {
                            "scheduleSeconds": 1,
                            "pullSeconds": 1,
                            "readySeconds": 1,
                        },
                    },
                    *(extra_clusters or []),
                ],
            }
        ]
    }


def workload(
    name: str = "echo",
    *,
    gpus: int = 1,
    fault: str | None = None,
    annotations: dict[str, str] | None = None,
    kind: str = "Deployment",
    restart_policy: str | None = None,
) -> dict[str, Any]:
    notes = dict(annotations or {})
    if fault:
        notes["sim.nvcf.io/fault"] = fault
    pod_spec: dict[str, Any] = {
        "containers": [
            {
                "name": "main",
                "image": f"nvcr.io/acme/{name}:1.0",
                "resources": {"limits": {"nvidia.com/gpu": gpus}} if gpus else {},
            }
        ]
    }
    if restart_policy:
        pod_spec["restartPolicy"] = restart_policy
    template = {"metadata": {"labels": {"app": name}, "annotations": notes}, "spec": pod_spec}
    spec: dict[str, Any] = {"template": template}
    if kind == "Deployment":
        spec.update(replicas=1, selector={"matchLabels": {"app": name}})
    else:
        spec["backoffLimit"] = 0
    api = "apps/v1" if kind == "Deployment" else "batch/v1"
    return {"apiVersion": api, "kind": kind, "metadata": {"name": name}, "spec": spec}


def service(name: str, app: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": {"app": app}, "ports": [{"port": 8000}]},
    }


async def add_version(
    session: AsyncSession,
    *,
    status: str = "INACTIVE",
    service_name: str | None = None,
    image: str | None = None,
) -> tuple[uuid.UUID, uuid.UUID]:
    """A function of `ACCOUNT` with one version (flushed), of container `image` if given:
    (function id, version id)."""
    fid, vid = uuid.uuid4(), uuid.uuid4()
    session.add(Function(id=fid, account_id=ACCOUNT))
    await session.flush()
    session.add(
        FunctionVersion(
            id=vid,
            function_id=fid,
            account_id=ACCOUNT,
            name="fn",
            status=status,
            inference_url="/infer",
            inference_port=8000,
            helm_chart_service_name=service_name,
            container_image=image,
            api_body_format="CUSTOM",
            function_type="DEFAULT",
            health={},
            description="",
            tags=[],
        )
    )
    await session.flush()
    return fid, vid


@dataclass
class Harness:
    """One database, one catalog of simulated clusters on a fake clock, one reconciler."""

    maker: async_sessionmaker[AsyncSession]
    catalog: Catalog
    clock: FakeClock
    registry: AdapterRegistry
    reconciler: Reconciler

    @classmethod
    def on(cls, maker: async_sessionmaker[AsyncSession]) -> Harness:
        """The catalog's simulated clusters on a fake clock, over `maker`'s database, and a
        reconciler (not started)."""
        catalog = Catalog.from_data(catalog_data())
        clock = FakeClock()
        registry = AdapterRegistry.from_catalog(catalog, clock=clock)
        h = cls(maker, catalog, clock, registry, None)  # type: ignore[arg-type]
        h.reconciler = h.new_reconciler()
        return h

    def new_reconciler(
        self,
        registry: AdapterRegistry | None = None,
        *,
        owner: OwnerId | None = None,
        secret_box: SecretBox | None = None,
        **config: Any,
    ) -> Reconciler:
        values: dict[str, Any] = {"interval": 0.01, "resync_seconds": 0, "timeouts": TIMEOUTS}
        values.update(config)
        return Reconciler(
            self.maker,
            registry or self.registry,
            self.catalog,
            config=ReconcilerConfig(**values),
            clock=self.clock,
            owner=owner,
            secret_box=secret_box,
        )

    def sim(self, name: str = "sim-a") -> SimulatedAdapter:
        adapter = self.registry.get(name)
        assert isinstance(adapter, SimulatedAdapter)
        return adapter

    async def deploy(
        self,
        objects: list[dict[str, Any]],
        *,
        min_instances: int = 1,
        instance_type: str = "NCP.GPU.H100_1x",
        flags: dict[str, Any] | None = None,
        status: str = "DEPLOYING",
        candidates: tuple[str, ...] = ("sim-a",),
        service_name: str | None = None,
        policy: dict[str, Any] | None = None,
    ) -> Deployment:
        async with self.maker() as session, session.begin():
            fid, vid = await add_version(session, status=status, service_name=service_name)
            dep = Deployment(
                id=uuid.uuid4(),
                account_id=ACCOUNT,
                function_id=fid,
                version_id=vid,
                function_name="fn",
                desired="deployed",
                feature_flags=flags or {},
                generation=1,
            )
            session.add(dep)
            await session.flush()
            session.add(
                DeploymentSpec(
                    id=uuid.uuid4(),
                    deployment_id=dep.id,
                    position=0,
                    gpu=instance_type.split(".")[2].split("_")[0],
                    instance_type=instance_type,
                    backend="test-group",
                    candidate_clusters=list(candidates),
                    min_instances=min_instances,
                    max_instances=max(1, min_instances),
                    helm_validation_policy=policy,
                    objects=objects,
                )
            )
        return dep

    async def status(self, dep: Deployment) -> str:
        async with self.maker() as session:
            version = await session.get(FunctionVersion, dep.version_id)
            assert version is not None
            return version.status

    async def instances(self, dep: Deployment, *, present_only: bool = False) -> list[Instance]:
        async with self.maker() as session:
            stmt = select(Instance).where(Instance.deployment_id == dep.id)
            if present_only:
                stmt = stmt.where(Instance.desired == "present")
            return list((await session.execute(stmt.order_by(Instance.created_at))).scalars())

    async def events(self, dep: Deployment, kind: str | None = None) -> list[DeploymentEvent]:
        async with self.maker() as session:
            stmt = select(DeploymentEvent).where(DeploymentEvent.deployment_id == dep.id)
            if kind:
                stmt = stmt.where(DeploymentEvent.kind == kind)
            return list((await session.execute(stmt.order_by(DeploymentEvent.id))).scalars())

    async def drive(
        self,
        until: Callable[[], Any],
        *,
        step: float = 1.0,
        passes: int = 200,
        reconciler: Reconciler | None = None,
    ) -> None:
        """Run passes, advancing the fake clock by `step` each time, until `until()` is truthy."""
        rec = reconciler or self.reconciler
        for _ in range(passes):
            report = await rec.run_once()
            assert report.errors == 0
            if await until():
                return
            self.clock.advance(step)
        raise AssertionError(f"did not converge within {passes} passes")

    async def until_status(self, dep: Deployment, status: str, **kw: Any) -> None:
        async def check() -> bool:
            return await self.status(dep) == status

        await self.drive(check, **kw)


async def namespaces(adapter: SimulatedAdapter, instances: list[Instance]) -> list[str]:
    """Instance namespaces the simulated cluster still has objects in."""
    out = []
    for inst in instances:
        spec = InstanceSpec(str(inst.id), "f", "v", "NCP.GPU.H100_1x", "H100", 1)
        if await adapter.objects(spec):
            out.append(spec.namespace)
    return out
