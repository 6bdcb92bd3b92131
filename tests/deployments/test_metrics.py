"""The deployment runtime's metrics on `/metrics` (docs/telemetry.md): the fleet gauges follow a
deployment through its life, are counted at most once per cache period whatever the scrape
rate, and the reconciler's passes and units are measured."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.support.api import create_fn
from tests.support.app import AppClient, ClientFactory
from tests.support.e2e import dep_url, eventually, until_status, write_catalog
from tests.support.metrics import Scrape, scrape

H100 = {"gpu": "H100", "backend": "e2e", "minInstances": 2, "maxInstances": 2}
FAST = {"reconcile_interval": 0.05, "reconcile_resync_seconds": 0.1}


async def app(client_factory: ClientFactory, tmp_path: Path, **overrides: Any) -> AppClient:
    return await client_factory(clusters_file=write_catalog(tmp_path), **{**FAST, **overrides})


def versions(got: Scrape) -> dict[str, float]:
    return {
        dict(labels)["status"]: value
        for (name, labels), value in got.samples.items()
        if name == "nvcf_function_versions" and value
    }


def instances(got: Scrape) -> dict[tuple[str, str], float]:
    return {
        (dict(labels)["phase"], dict(labels)["cluster"]): value
        for (name, labels), value in got.samples.items()
        if name == "nvcf_instances" and value
    }


async def test_fleet_gauges_follow_a_deployment_and_the_reconciler_is_measured(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    client = await app(client_factory, tmp_path, metrics_fleet_cache_seconds=0)
    got = await scrape(client)
    assert versions(got) == {} and instances(got) == {}
    assert got.value("nvcf_function_versions", status="ACTIVE") == 0  # exported at zero

    fn = await create_fn(client)
    await create_fn(client, name="idle")
    resp = await client.post(dep_url(fn), json={"deploymentSpecifications": [H100]})
    assert resp.status_code == 200, resp.text
    await until_status(client, fn, "ACTIVE")

    async def both_running() -> Scrape | None:
        got = await scrape(client)
        return got if instances(got) == {("Running", "e2e-a"): 2} else None

    got = await eventually(both_running)
    assert versions(got) == {"ACTIVE": 1, "INACTIVE": 1}
    assert got.value("nvcf_reconcile_units_total", result="ok") >= 1
    assert got.value("nvcf_reconcile_units_total", result="failed") == 0
    assert got.value("nvcf_reconcile_pass_duration_seconds_count") >= 1

    resp = await client.delete(dep_url(fn))
    assert resp.status_code == 200, resp.text

    async def torn_down() -> Scrape | None:
        got = await scrape(client)
        return got if instances(got) == {} else None

    got = await eventually(torn_down)
    assert versions(got) == {"INACTIVE": 2}
    # the series seen stays, at zero
    assert ("nvcf_instances", frozenset({("phase", "Running"), ("cluster", "e2e-a")})) in (
        got.samples
    )


async def test_fleet_gauges_are_counted_at_most_once_per_cache_period(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    client = await app(client_factory, tmp_path, metrics_fleet_cache_seconds=3600)
    fleet = client.app.state.telemetry.fleet
    # concurrent scrapes wait for the one count in flight
    scrapes = await asyncio.gather(*(scrape(client) for _ in range(5)))
    assert fleet.refreshes == 1
    assert all(versions(s) == {} for s in scrapes)
    await create_fn(client)
    assert versions(await scrape(client)) == {}  # the cached count, not the database's
    assert fleet.refreshes == 1
    fleet.max_age = 0
    assert versions(await scrape(client)) == {"INACTIVE": 1}
    assert fleet.refreshes == 2
