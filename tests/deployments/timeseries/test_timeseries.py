"""The per-version time series the console charts: sampled from the server's own counters
(invocations, their latency histogram, queue depth, Running instances), served for the last
hour to the version's account only."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from service.deployments.timeseries.store import KEEP_SECONDS, TimeSeries, quantile
from tests.support.api import assert_problem, bearer, create_fn, new_key
from tests.support.app import AppClient, ClientFactory
from tests.support.e2e import V, dep_url, eventually, until_status, write_catalog

H100 = {"gpu": "H100", "backend": "e2e", "minInstances": 1, "maxInstances": 1}
FAST = {"reconcile_interval": 0.05, "reconcile_resync_seconds": 0.1}


def test_quantiles_are_the_upper_bound_of_their_bucket() -> None:
    cumulative = {0.01: 50.0, 0.1: 98.0, 1.0: 100.0, float("inf"): 100.0}
    assert quantile(cumulative, 0.5) == 0.01
    assert quantile(cumulative, 0.99) == 1.0
    assert quantile({0.1: 0.0, float("inf"): 0.0}, 0.5) is None


async def test_requests_latency_and_instances_of_a_version(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    client: AppClient = await client_factory(
        clusters_file=write_catalog(tmp_path), timeseries_period_seconds=0, **FAST
    )
    fn = await create_fn(client)
    assert (await client.post(dep_url(fn), json={"deploymentSpecifications": [H100]})).is_success
    await until_status(client, fn, "ACTIVE")
    series = client.app.state.timeseries
    await series.sample()  # the baseline: nothing counted yet
    for _ in range(3):
        resp = await client.post(f"{V}/pexec/functions/{fn['id']}", json={"q": 1})
        assert resp.status_code == 200, resp.text
    failed = await client.post(
        f"{V}/pexec/functions/{fn['id']}", json={}, headers={"X-Sim-Status": "500"}
    )
    assert failed.status_code == 500
    url = f"{V}/functions/{fn['id']}/versions/{fn['versionId']}/metrics"

    async def counted() -> list[dict[str, Any]] | None:
        # a request is counted once its answer has ended: sample until all four are
        await series.sample()
        resp = await client.get(url)
        assert resp.status_code == 200, resp.text
        points: list[dict[str, Any]] = resp.json()["points"][1:]
        return points if sum(p["requests"] for p in points) == 4 else None

    points = await eventually(counted)
    assert sum(p["errors"] for p in points) == 1
    assert all(p["running"] == 1 and p["queueDepth"] == 0 for p in points)
    busy = [p for p in points if p["requests"]]
    assert all(p["latencyP50"] is not None and p["latencyP99"] >= p["latencyP50"] for p in busy)

    await series.sample()  # an idle period: no requests, still one instance
    idle = (await client.get(url)).json()["points"][-1]
    assert (idle["requests"], idle["latencyP50"], idle["running"]) == (0, None, 1)

    # undeployed: its instances change, so the samples count them again, down to none
    assert (await client.delete(dep_url(fn))).is_success

    async def none_running() -> bool:
        await series.sample()
        return bool((await client.get(url)).json()["points"][-1]["running"] == 0)

    assert await eventually(none_running)

    other = await new_key(client, ["list_functions"], account="other-account")
    assert_problem(await client.get(url, headers=bearer(other)), 404)
    assert_problem(await client.get(f"{V}/functions/{fn['id']}/versions/x/metrics"), 400)


def test_a_settled_fleet_stores_no_point_per_period_and_reads_one() -> None:
    series = TimeSeries(CollectorRegistry(), None, period=10)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    fleet = {f"v{i}": 1 for i in range(1000)}
    for n in range(5):
        series.add({}, fleet, start + timedelta(seconds=10 * n))
    assert series.stored == 1000  # the first sample of each version, nothing since

    series.add({}, {**fleet, "v7": 2}, start + timedelta(seconds=50))
    series.add({}, fleet, start + timedelta(seconds=60))
    assert series.stored == 1002  # v7 changed twice
    points = series.points("v7")
    assert [p["running"] for p in points] == [1, 1, 1, 1, 1, 2, 1]
    assert points[-1]["at"] == "2026-01-01T00:01:00.000Z"
    assert all(p["requests"] == 0 and p["latencyP99"] is None for p in points)
    assert len(series.points("v8")) == 7
    assert series.points("unknown") == []

    # an hour later the oldest samples are gone, the values they set are not
    hour = int(KEEP_SECONDS / 10)
    for n in range(7, 7 + hour):
        series.add({}, fleet, start + timedelta(seconds=10 * n))
    points = series.points("v7")
    assert len(points) == hour and {p["running"] for p in points} == {1}
