"""Reconciler benchmark: `.venv/bin/python bench/reconcile.py [--db URL]`.

1. Time for 200 deployments (one instance each) to become ACTIVE on a simulated cluster with
   zero delays, against a baseline measured in the same run: inserting those 200 deployments.
2. Reconciler CPU time (time.process_time) per deployment per pass with 1,000 idle ACTIVE
   deployments — an idle pass (nothing due) and a resync pass (every Running instance
   observed) — against a baseline: reading those deployment and instance rows in one query each.

Uses a fresh SQLite file (migrated by Alembic) unless `--db` names another empty database.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import select

from service.clusters.adapters import AdapterRegistry
from service.clusters.catalog import Catalog
from service.core import migrate
from service.core.db import make_engine, make_sessionmaker
from service.deployments.models import Deployment, DeploymentSpec, Instance
from service.deployments.reconciler import Reconciler, ReconcilerConfig
from service.functions.models import Function, FunctionVersion

ACCOUNT = "bench"


def catalog(gpus: int) -> Catalog:
    return Catalog.from_data(
        {
            "clusterGroups": [
                {
                    "name": "bench",
                    "clusters": [
                        {
                            "name": "sim-bench",
                            "adapter": "simulated",
                            "provider": "NCP",
                            "region": "local",
                            "nodes": [{"gpu": "H100", "gpusPerNode": 8, "count": gpus // 8}],
                            "simulation": {
                                "scheduleSeconds": 0,
                                "pullSeconds": 0,
                                "readySeconds": 0,
                            },
                        }
                    ],
                }
            ]
        }
    )


OBJECTS: list[dict[str, Any]] = [
    {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "echo"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "echo"}},
            "template": {
                "metadata": {"labels": {"app": "echo"}},
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "image": "nvcr.io/acme/echo:1.0",
                            "resources": {"limits": {"nvidia.com/gpu": 1}},
                        }
                    ]
                },
            },
        },
    }
]


async def insert(maker: Any, count: int) -> list[uuid.UUID]:
    versions: list[uuid.UUID] = []
    async with maker() as session, session.begin():
        for i in range(count):
            fid, vid, did = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
            versions.append(vid)
            session.add(Function(id=fid, account_id=ACCOUNT))
            session.add(
                FunctionVersion(
                    id=vid,
                    function_id=fid,
                    account_id=ACCOUNT,
                    name=f"fn-{i}",
                    status="DEPLOYING",
                    inference_url="/echo",
                    inference_port=8000,
                    api_body_format="CUSTOM",
                    function_type="DEFAULT",
                    health={},
                    description="",
                    tags=[],
                )
            )
            session.add(
                Deployment(
                    id=did,
                    account_id=ACCOUNT,
                    function_id=fid,
                    version_id=vid,
                    function_name=f"fn-{i}",
                    desired="deployed",
                    feature_flags={},
                    generation=1,
                )
            )
            session.add(
                DeploymentSpec(
                    id=uuid.uuid4(),
                    deployment_id=did,
                    position=0,
                    gpu="H100",
                    instance_type="NCP.GPU.H100_1x",
                    backend="bench",
                    candidate_clusters=["sim-bench"],
                    min_instances=1,
                    max_instances=1,
                    objects=OBJECTS,
                )
            )
            if i % 100 == 99:
                await session.flush()
    return versions


async def all_active(maker: Any, versions: list[uuid.UUID]) -> bool:
    async with maker() as session:
        statuses = (
            await session.execute(
                select(FunctionVersion.status).where(FunctionVersion.id.in_(versions))
            )
        ).scalars()
        return all(s == "ACTIVE" for s in statuses)


async def converge(rec: Reconciler, maker: Any, versions: list[uuid.UUID]) -> int:
    passes = 0
    while not await all_active(maker, versions):
        report = await rec.run_once()
        passes += 1
        if report.errors or passes > 100:
            raise SystemExit(f"not converging (pass {passes}, errors {report.errors})")
    return passes


def meter_adapter(registry: AdapterRegistry) -> list[float]:
    """Accumulate the CPU time spent inside the adapters' observe calls."""
    total = [0.0]
    for _, adapter in registry.items():
        original = adapter.observe

        async def observe(instance: Any, _original: Any = original) -> Any:
            start = time.process_time()
            try:
                return await _original(instance)
            finally:
                total[0] += time.process_time() - start

        adapter.observe = observe  # type: ignore[method-assign]
    return total


async def main(db: str | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        url = db or f"sqlite+aiosqlite:///{Path(tmp) / 'bench.db'}"
        await asyncio.to_thread(migrate.upgrade, url)
        engine = make_engine(url)
        maker = make_sessionmaker(engine)
        cat = catalog(1200)
        registry = AdapterRegistry.from_catalog(cat)
        concurrency = 1 if url.startswith("sqlite") else 8
        config = ReconcilerConfig(interval=0.01, resync_seconds=3600, concurrency=concurrency)
        rec = Reconciler(maker, registry, cat, config=config)
        print(f"database: {url.split('://')[0]}")

        # --- 1. 200 deployments to ACTIVE
        start = time.perf_counter()
        first = await insert(maker, 200)
        baseline_insert = time.perf_counter() - start
        start = time.perf_counter()
        passes = await converge(rec, maker, first)
        to_active = time.perf_counter() - start
        print(
            f"200 deployments to ACTIVE: {to_active:.3f}s in {passes} passes "
            f"({to_active / 200 * 1000:.2f} ms/deployment); baseline insert of the 200 "
            f"deployments {baseline_insert:.3f}s; ratio {to_active / baseline_insert:.1f}x"
        )

        # --- 2. 1,000 idle ACTIVE deployments
        rest = await insert(maker, 800)
        await converge(rec, maker, first + rest)
        await rec.run_once()  # settle
        start_cpu = time.process_time()
        async with maker() as session:
            (await session.execute(select(Deployment.id, Deployment.generation))).all()
            (await session.execute(select(Instance.id, Instance.phase))).all()
        baseline_read = time.process_time() - start_cpu
        rounds = 20
        start_cpu = time.process_time()
        for _ in range(rounds):
            report = await rec.run_once()
            assert report.reconciled == 0, report
        idle = (time.process_time() - start_cpu) / rounds
        rec.config = ReconcilerConfig(interval=0.01, resync_seconds=0, concurrency=concurrency)
        adapter_cpu = meter_adapter(registry)
        rounds_resync = 3
        start_cpu = time.process_time()
        for _ in range(rounds_resync):
            report = await rec.run_once()
            assert report.resynced + report.reconciled == 1000 and not report.errors, report
        resync = (time.process_time() - start_cpu) / rounds_resync
        in_adapter = adapter_cpu[0] / rounds_resync
        assert await all_active(maker, first + rest)
        print(
            f"1,000 idle ACTIVE deployments: idle pass {idle * 1000:.1f} ms CPU "
            f"({idle / 1000 * 1e6:.1f} us/deployment/pass), baseline read of the rows "
            f"{baseline_read * 1000:.1f} ms CPU, ratio {idle / baseline_read:.2f}x"
        )
        print(
            f"1,000 ACTIVE deployments, resync pass (every instance re-observed and evaluated, "
            f"{report.resynced} without a database round trip): "
            f"{resync * 1000:.0f} ms CPU ({resync / 1000 * 1e6:.0f} us/deployment/pass), "
            f"ratio to the baseline read {resync / baseline_read:.0f}x; of which inside the "
            f"simulated adapter {in_adapter * 1000:.0f} ms, reconciler itself "
            f"{(resync - in_adapter) / 1000 * 1e6:.0f} us/deployment/pass "
            f"(ratio {(resync - in_adapter) / baseline_read:.0f}x)"
        )
        await registry.aclose()
        await engine.dispose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="database URL (an empty database; default: temp SQLite)")
    asyncio.run(main(parser.parse_args().db))
