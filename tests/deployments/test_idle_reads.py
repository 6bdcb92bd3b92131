"""What a settled fleet costs between changes (issue 32): every statement the server's periodic
rounds run with nothing happening — the reconciler's pass, the autoscaler's reading, the time
series' sample, the history purge, the load report and the invocation plane's heartbeat and
sweep — reads the tables that grow with the fleet through an index, never by scanning them
(SQLite's plan of the very statements run, with their parameters). Migration 0019 adds the
indexes they use."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, event, inspect
from sqlalchemy.ext.asyncio import AsyncEngine

from service.core import migrate
from tests.support.api import create_fn
from tests.support.app import AppClient, ClientFactory
from tests.support.e2e import dep_url, until_status, write_catalog

sqlite_only = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
H100 = {"gpu": "H100", "backend": "e2e", "minInstances": 1, "maxInstances": 2}
#: tables with rows per function, deployment or instance (per-replica tables stay small)
FLEET_TABLES = {
    "functions",
    "function_versions",
    "deployments",
    "deployment_specs",
    "deployment_spec_revisions",
    "instances",
    "deployment_events",
    "deployment_history",
    "autoscale_state",
}
#: partial indexes: reading all of one reads only the rows it holds
PARTIAL = ("ix_deployment_specs_above_minimum",)


@contextmanager
def statements(engine: AsyncEngine) -> Iterator[list[tuple[str, Any]]]:
    """Every SELECT/UPDATE/DELETE run on `engine` meanwhile, with its parameters."""
    seen: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if statement.lstrip().split(" ", 1)[0].upper() in ("SELECT", "UPDATE", "DELETE"):
            seen.append((statement, params))

    event.listen(engine.sync_engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", record)


async def scans(engine: AsyncEngine, run: list[tuple[str, Any]]) -> list[str]:
    """The statements of `run` whose plan scans a fleet table, with the scan."""
    out: list[str] = []
    async with engine.connect() as conn:
        for statement, params in run:
            plan = await conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, params)
            for row in plan.all():
                detail = str(row[-1])
                words = detail.split()
                if (
                    words[:1] == ["SCAN"]
                    and len(words) > 1
                    and words[1] in FLEET_TABLES
                    and not detail.endswith(PARTIAL)
                ):
                    out.append(f"{detail}: {statement}")
    return out


@sqlite_only
async def test_the_periodic_rounds_of_a_settled_fleet_read_by_index(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    client: AppClient = await client_factory(
        clusters_file=write_catalog(tmp_path, h100_nodes=2),
        reconcile_interval=0.05,
        timeseries_period_seconds=0,
    )
    fns = [await create_fn(client) for _ in range(2)]
    for fn in fns:
        resp = await client.post(dep_url(fn), json={"deploymentSpecifications": [H100]})
        assert resp.is_success, resp.text
    for fn in fns:
        await until_status(client, fn, "ACTIVE")
    state = client.app.state
    await state.timeseries.sample()  # the first sample counts every version

    with statements(state.engine) as run:
        await state.reconciler.run_once()
        await state.autoscaler.run_once()
        await state.timeseries.sample()  # a later one: what changed since
        await state.history_purger.purge()
        await state.invocation.load_publisher.publish()
        await state.invocation.store.heartbeat()
        await state.invocation.store.end_dead()
    kinds = {s.split(" ", 1)[0] for s, _ in run}
    assert "SELECT" in kinds and len(run) >= 6, run  # the rounds did read
    assert await scans(state.engine, run) == []


def _indexes(database_url: str) -> set[str]:
    engine = create_engine(migrate.sync_url(database_url))
    try:
        with engine.connect() as conn:
            inspector = inspect(conn)
            return {
                str(i["name"])
                for table in ("instances", "deployment_history", "deployment_specs")
                for i in inspector.get_indexes(table)
            }
    finally:
        engine.dispose()


def test_migration_0019_adds_the_indexes_and_its_downgrade_removes_them(
    database_url: str,
) -> None:
    added = {
        "ix_instances_updated_at",
        "ix_deployment_history_removed_at",
        "ix_deployment_specs_above_minimum",
    }
    assert added <= _indexes(database_url)
    migrate.downgrade(database_url, "0018")
    assert not added & _indexes(database_url)
    migrate.upgrade(database_url)
    assert added <= _indexes(database_url)
