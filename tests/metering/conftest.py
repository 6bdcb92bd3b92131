"""Fixtures of the metering tests: the reconciler harness (tests/support/reconcile.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from service.clusters.adapters import AdapterRegistry
from service.clusters.catalog import Catalog
from service.core.db import make_engine, make_sessionmaker
from tests.support.reconcile import FakeClock, Harness, catalog_data


@pytest.fixture
async def harness(database_url: str) -> AsyncIterator[Harness]:
    """A reconciler over a database per test (SQLite and PostgreSQL) and simulated clusters on
    a fake clock."""
    engine = make_engine(database_url)
    maker = make_sessionmaker(engine)
    catalog = Catalog.from_data(catalog_data())
    clock = FakeClock()
    registry = AdapterRegistry.from_catalog(catalog, clock=clock)
    h = Harness(maker, catalog, clock, registry, None)  # type: ignore[arg-type]
    h.reconciler = h.new_reconciler()
    try:
        yield h
    finally:
        await engine.dispose()
