"""The deployment runtime's reconciler: the loop (loop.py), one unit of work (unit.py; what it
holds, work.py; its closing transaction, finish.py), all of its SQL (store.py), instance counts
and rollouts (converge.py), drains (drain.py), placement (placement.py), what a backend
receives (targets.py), and the namespace garbage collector, a loop service of its own
(gc.py)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.clusters.adapters import AdapterRegistry
from service.clusters.catalog import Catalog
from service.core.crypto import SecretBox
from service.core.settings import Settings
from service.core.tracing import NO_TRACING, Tracing
from service.deployments.metrics import ReconcileMetrics
from service.deployments.reconcile.config import CollectorConfig, ReconcilerConfig
from service.deployments.reconcile.gc import GarbageReport, NamespaceCollector
from service.deployments.reconcile.loop import PassReport, Reconciler
from service.deployments.reconcile.owner import OwnerId, claim_owner


def build_reconciler(
    settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    registry: AdapterRegistry,
    catalog: Catalog,
    *,
    secret_box: SecretBox | None = None,
    metrics: ReconcileMetrics | None = None,
    tracing: Tracing = NO_TRACING,
    owner: OwnerId | None = None,
) -> tuple[Reconciler, NamespaceCollector]:
    """The server's reconciler and namespace collector, configured from settings; the
    collector runs between the reconciler's passes. `owner`: the replica's id (shared with
    the invocation plane); claimed from the data dir when not given."""
    reconciler = Reconciler(
        sessionmaker,
        registry,
        catalog,
        config=ReconcilerConfig.from_settings(settings),
        secret_box=secret_box,
        owner=owner or claim_owner(Path(settings.data_dir)),
        metrics=metrics,
        tracing=tracing,
    )
    collector = NamespaceCollector(
        reconciler.store,
        registry,
        CollectorConfig.from_settings(settings),
        between_passes=reconciler.pass_lock,
    )
    return reconciler, collector


__all__ = [
    "CollectorConfig",
    "GarbageReport",
    "NamespaceCollector",
    "OwnerId",
    "PassReport",
    "Reconciler",
    "ReconcilerConfig",
    "build_reconciler",
    "claim_owner",
]
