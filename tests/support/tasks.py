"""The task loop harness: one database, a simulated cluster on a fake clock (one H100 node
of `gpus` GPUs, no scheduling or pull delay), the task use cases and the loop, driven pass by
pass; `restart()` is a new server process over the same database and cluster."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import oras.provider
import requests
from cryptography.fernet import Fernet
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.backends.protocol import InstanceSpec
from service.clusters.adapters import AdapterRegistry
from service.clusters.catalog import Catalog
from service.core.crypto import SecretBox
from service.core.pagination import Page
from service.core.quotas import Quotas
from service.core.settings import Settings
from service.tasks import repository
from service.tasks.loop import TaskLoop
from service.tasks.models import Task, TaskEvent, TaskResult
from service.tasks.observed import instance_of
from service.tasks.service import Tasks
from tests.support.reconcile import FakeClock
from tests.support.registry import RegistryServer

ACCOUNT = "acct-tasks"
#: what a test's task asks for unless it says otherwise
BASE = {
    "name": "job",
    "gpuSpecification": {"gpu": "H100", "instanceType": "NCP.GPU.H100_1x"},
    "containerImage": "nvcr.io/acme/trainer:1.0",
    "resultHandlingStrategy": "NONE",
}


def catalog(gpus: int = 2, attributes: tuple[str, ...] = ()) -> Catalog:
    return Catalog.from_data(
        {
            "clusterGroups": [
                {
                    "name": "test-group",
                    "clusters": [
                        {
                            "name": "sim-a",
                            "adapter": "simulated",
                            "provider": "NCP",
                            "region": "us-east-1",
                            "attributes": list(attributes),
                            "nodes": [{"gpu": "H100", "gpusPerNode": gpus, "count": 1}],
                            "simulation": {
                                "scheduleSeconds": 0,
                                "pullSeconds": 0,
                                "readySeconds": 1,
                            },
                        }
                    ],
                }
            ]
        }
    )


def script(**fields: Any) -> list[dict[str, str]]:
    """`containerEnvironment` naming a task runner script (backends/simulated/tasks.py)."""
    return [{"key": "SIM_TASK_SCRIPT", "value": json.dumps(fields)}]


@dataclass
class TaskHarness:
    maker: async_sessionmaker[AsyncSession]
    catalog: Catalog
    clock: FakeClock
    registry: AdapterRegistry
    box: SecretBox
    tasks: Tasks
    loop: TaskLoop

    @classmethod
    def build(
        cls,
        maker: async_sessionmaker[AsyncSession],
        gpus: int = 2,
        attributes: tuple[str, ...] = (),
        **settings: Any,
    ) -> TaskHarness:
        """`attributes`: the cluster's (NVLinkOptimized, say)."""
        cat = catalog(gpus, attributes)
        clock = FakeClock()
        registry = AdapterRegistry.from_catalog(cat, clock=clock)
        box = SecretBox(Fernet.generate_key())
        conf = Settings(_env_file=None, **settings)
        tasks = Tasks(cat, box, Quotas.from_settings(conf), settings=conf, clock=clock)
        return cls(
            maker,
            cat,
            clock,
            registry,
            box,
            tasks,
            TaskLoop(maker, registry, cat, tasks, clock=clock),
        )

    def restart(self) -> None:
        """A new server process: new use cases and loop, same database, cluster and clock."""
        self.tasks = Tasks(
            self.catalog,
            self.box,
            self.tasks.quotas,
            settings=self.tasks.settings,
            clock=self.clock,
        )
        self.loop = TaskLoop(self.maker, self.registry, self.catalog, self.tasks, clock=self.clock)

    async def create(self, **changes: Any) -> uuid.UUID:
        async with self.maker() as session, session.begin():
            task = await self.tasks.create(session, ACCOUNT, {**BASE, **changes})
            return task.id

    async def run(self, seconds: float = 0.0, step: float = 1.0) -> None:
        """One pass now, then one every `step` seconds of the fake clock for `seconds`."""
        await self.loop.run_pass()
        waited = 0.0
        while waited < seconds:
            self.clock.advance(step)
            waited += step
            await self.loop.run_pass()

    async def task(self, task_id: uuid.UUID) -> Task:
        async with self.maker() as session:
            row = await repository.get(session, task_id)
            assert row is not None
            return row

    async def events(self, task_id: uuid.UUID) -> list[str]:
        async with self.maker() as session:
            rows: list[TaskEvent]
            rows, _ = await repository.events_page(session, task_id, _all())
            return [e.message for e in rows]

    async def results(self, task_id: uuid.UUID) -> list[TaskResult]:
        async with self.maker() as session:
            rows, _ = await repository.results_page(session, task_id, _all())
            return rows

    async def on_cluster(self, task_id: uuid.UUID) -> bool:
        """Whether the task's objects are on the simulated cluster."""
        adapter = self.registry.get("sim-a")
        assert adapter is not None
        spec = InstanceSpec(str(task_id), "", "", "NCP.GPU.H100_1x", "H100", 1, task=True)
        return not (await adapter.observe(spec)).is_empty

    async def instance(self, task_id: uuid.UUID) -> InstanceSpec:
        return instance_of(await self.task(task_id))


def _all() -> Page:
    return Page(limit=None, after=None)


def oras_pull(server: RegistryServer, reference: str, outdir: Path) -> dict[str, bytes]:
    """`oras pull` of `reference` into `outdir`: every file pulled, by its relative path."""
    client = oras.provider.Registry(hostname=server.host, insecure=True, auth_backend="basic")
    if server.username is not None and server.password is not None:
        client.auth.set_basic_auth(server.username, server.password)
    client.pull(target=reference, outdir=str(outdir))
    return {
        str(path.relative_to(outdir)): path.read_bytes()
        for path in sorted(outdir.rglob("*"))
        if path.is_file()
    }


def manifest_digest(server: RegistryServer, reference: str) -> str:
    repository, tag = reference.removeprefix(f"{server.host}/").rsplit(":", 1)
    auth = (server.username, server.password) if server.username and server.password else None
    response = requests.head(
        f"http://{server.host}/v2/{repository}/manifests/{tag}",
        headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
        auth=auth,
        timeout=10,
    )
    assert response.status_code == 200, response.status_code
    return response.headers["Docker-Content-Digest"]
