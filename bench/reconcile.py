"""Reconciler benchmark: `.venv/bin/python bench/reconcile.py [--db URL] [--count N]`.

1. Time for N deployments (default 10,000; one instance each, container functions) to become
   ACTIVE on a simulated cluster with zero delays, in ms per deployment, against a baseline
   measured in the same run: inserting those deployments.
2. Reconciler CPU time (time.process_time) of an idle pass (nothing due) with N/10 and with N
   ACTIVE deployments: the ratio shows whether doing nothing grows with the fleet.
3. A resync (every Running instance re-observed): CPU per deployment, against a baseline read
   of every deployment and instance row.

4. A change in one instance of the fleet (a fault annotation flipped on its pods in the
   simulated cluster) with the reconciler running as the server runs it (its loop, the default
   interval): the time until that instance's condition changes, against the interval.

Uses a fresh SQLite file (migrated by Alembic) unless `--db` names another empty database.

`--baseline-tree PATH` (a checkout of an older commit, e.g. `git worktree add /tmp/old
a919185`, the last commit before the reconciler package) also runs step 1 with that tree's
reconciler in a subprocess, in the same run, and prints the speed-up.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

# The service under test: this checkout, or an older one for the baseline (--baseline-tree).
sys.path.insert(0, os.environ.get("BENCH_SERVICE_TREE") or str(Path(__file__).resolve().parents[1]))

from sqlalchemy import select

from service.clusters.catalog import Catalog
from service.core import migrate
from service.core.db import make_engine, make_sessionmaker
from service.deployments.models import Deployment, DeploymentSpec, Instance
from service.functions.models import Function, FunctionVersion

try:
    from service.clusters.adapters import AdapterRegistry
    from service.deployments.reconcile import Reconciler, ReconcilerConfig
except ImportError:  # a tree from before the reconciler package (the baseline)
    from service.backends.registry import AdapterRegistry  # type: ignore[no-redef]
    from service.deployments.reconciler import (  # type: ignore[no-redef]
        Reconciler,
        ReconcilerConfig,
    )

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
        if report.errors or passes > 1000:
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


async def idle_pass_cpu(rec: Reconciler, rounds: int = 300) -> float:
    """CPU seconds of one reconciliation pass with nothing due: the median of `rounds` passes
    (a pass costs a few milliseconds; the median keeps a stray collection out of it)."""
    samples = []
    for _ in range(rounds):
        start = time.process_time()
        report = await rec.run_once()
        samples.append(time.process_time() - start)
        assert report.reconciled == 0 and report.resynced == 0, report
    return statistics.median(samples)


async def main(db: str | None, count: int, only_to_active: bool = False) -> float:
    """Run the benchmark; return the to-ACTIVE milliseconds per deployment."""
    with tempfile.TemporaryDirectory() as tmp:
        url = db or f"sqlite+aiosqlite:///{Path(tmp) / 'bench.db'}"
        await asyncio.to_thread(migrate.upgrade, url)
        engine = make_engine(url)
        maker = make_sessionmaker(engine)
        cat = catalog(((count + 7) // 8) * 8)
        registry = AdapterRegistry.from_catalog(cat)
        concurrency = 1 if url.startswith("sqlite") else 8
        config = ReconcilerConfig(interval=0.01, resync_seconds=3600, concurrency=concurrency)
        rec = Reconciler(maker, registry, cat, config=config)
        print(f"database: {url.split('://')[0]}")

        # --- 1. idle passes at a tenth of the fleet, then the whole fleet to ACTIVE
        small = count // 10
        start = time.perf_counter()
        first = await insert(maker, small)
        baseline_small = time.perf_counter() - start
        await converge(rec, maker, first)
        await rec.run_once()  # settle
        idle_small = await idle_pass_cpu(rec)

        start = time.perf_counter()
        rest = await insert(maker, count - small)
        baseline_insert = (time.perf_counter() - start) + baseline_small
        start = time.perf_counter()
        passes = await converge(rec, maker, rest)
        to_active = time.perf_counter() - start
        per = to_active / (count - small) * 1000
        print(
            f"{count - small:,} deployments to ACTIVE: {to_active:.2f}s in {passes} passes "
            f"({per:.2f} ms/deployment); baseline insert of {count:,} deployments "
            f"{baseline_insert:.2f}s ({baseline_insert / count * 1000:.2f} ms/deployment); "
            f"ratio {per / (baseline_insert / count * 1000):.1f}x"
        )
        if only_to_active:
            await registry.aclose()
            await engine.dispose()
            return per

        # --- 2. an idle pass does not grow with the number of idle deployments
        await rec.run_once()  # settle
        idle_all = await idle_pass_cpu(rec)
        print(
            f"idle pass (nothing due): {idle_small * 1e6:.0f} us CPU with {small:,} ACTIVE "
            f"deployments, {idle_all * 1e6:.0f} us with {count:,}; "
            f"ratio {idle_all / idle_small:.2f}x"
        )

        # --- 3. a resync: every Running instance re-observed
        start_cpu = time.process_time()
        async with maker() as session:
            (await session.execute(select(Deployment.id, Deployment.generation))).all()
            (await session.execute(select(Instance.id, Instance.phase))).all()
        baseline_read = time.process_time() - start_cpu
        adapter_cpu = meter_adapter(registry)
        start_cpu = time.process_time()
        made_due = await rec.request_resync()
        report = await rec.run_once()
        resync = time.process_time() - start_cpu
        assert made_due == count and report.resynced + report.reconciled == count, report
        assert not report.errors and await all_active(maker, first + rest)
        print(
            f"resync of {count:,} ACTIVE deployments (every instance re-observed and evaluated, "
            f"{report.resynced:,} without a unit of work): {resync:.2f}s CPU "
            f"({resync / count * 1e6:.0f} us/deployment), of which inside the simulated "
            f"adapter {adapter_cpu[0]:.2f}s; baseline read of every deployment and instance "
            f"row {baseline_read * 1000:.0f} ms CPU, ratio {resync / baseline_read:.0f}x"
        )
        # --- 4. one change in the fleet: seen within one interval, alone
        if hasattr(registry.get("sim-bench"), "annotate_pods"):
            await rec.stop()  # gives up its leases: the server's reconciler takes over
            await flip_one(maker, registry, cat, count)
        await registry.aclose()
        await engine.dispose()
        return per


async def flip_one(maker: Any, registry: AdapterRegistry, cat: Catalog, count: int) -> None:
    """Flip a fault on one instance with the reconciler's loop running; print how long until
    its condition changed, against the default interval."""
    config = ReconcilerConfig(resync_seconds=3600, concurrency=1)
    rec = Reconciler(maker, registry, cat, config=config)
    await rec.run_once()  # the start-up resync, out of the way
    async with maker() as session:
        inst_id, before = (await session.execute(select(Instance.id, Instance.condition))).first()
    adapter: Any = registry.get("sim-bench")
    rec.start()
    observed = meter_adapter(registry)  # CPU inside observe from here on
    calls: list[str] = []
    original = adapter.observe

    async def counting(instance: Any) -> Any:
        calls.append(instance.instance_id)
        return await original(instance)

    adapter.observe = counting
    started = time.perf_counter()
    await adapter.annotate_pods(str(inst_id), {"sim.nvcf.io/fault": "NeverReady"})
    while True:
        async with maker() as session:
            now = await session.scalar(select(Instance.condition).where(Instance.id == inst_id))
        if now != before:
            break
        await asyncio.sleep(0.005)
    took = time.perf_counter() - started
    await rec.stop()
    print(
        f"a fault flipped on 1 instance of {count:,}: its condition changed after "
        f"{took * 1000:.0f} ms, {took / config.interval:.2f} of the reconcile interval "
        f"({config.interval:g}s); instances observed meanwhile: {len(set(calls))} "
        f"({observed[0] * 1000:.1f} ms CPU in observe)"
    )


def baseline(tree: str, count: int) -> float:
    """Step 1 with the reconciler of another checkout, in a subprocess of the same run."""
    out = subprocess.run(
        [sys.executable, __file__, "--count", str(count), "--only-to-active"],
        env={**os.environ, "BENCH_SERVICE_TREE": tree, "PYTHONPATH": tree},
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    print(f"baseline ({tree}): " + out.strip().replace("\n", "\n  "))
    return float(out.rsplit("PER_DEPLOYMENT_MS=", 1)[1])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="database URL (an empty database; default: temp SQLite)")
    parser.add_argument("--count", type=int, default=10_000, help="deployments (default 10,000)")
    parser.add_argument("--baseline-tree", help="an older checkout to compare step 1 with")
    parser.add_argument("--only-to-active", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.baseline_tree:
        before = baseline(args.baseline_tree, args.count)
    per = asyncio.run(main(args.db, args.count, args.only_to_active))
    if args.only_to_active:
        print(f"PER_DEPLOYMENT_MS={per}")
    elif args.baseline_tree:
        print(
            f"to ACTIVE: {before:.2f} ms/deployment with the baseline tree, {per:.2f} with this "
            f"one: {before / per:.1f}x faster"
        )
