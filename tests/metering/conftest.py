"""Fixtures of the metering tests: the reconciler harness (tests/support/reconcile.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from service.core.db import make_engine, make_sessionmaker
from tests.support.reconcile import Harness


@pytest.fixture
async def harness(database_url: str) -> AsyncIterator[Harness]:
    """A reconciler over a database per test (SQLite and PostgreSQL) and simulated clusters on
    a fake clock."""
    engine = make_engine(database_url)
    try:
        yield Harness.on(make_sessionmaker(engine))
    finally:
        await engine.dispose()
