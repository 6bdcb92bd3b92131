"""A function's metrics over Prometheus remote write (PROMETHEUS, VICTORIAMETRICS), against a
receiver that decodes the wire (raw snappy, prompb's WriteRequest): counts and labels exact,
the key as a bearer token, a refusing endpoint seen in the telemetry's status; and against
Debian's real `prometheus` and `victoria-metrics`, queried back with PromQL."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.app import AppClient, ClientFactory
from tests.support.e2e import eventually
from tests.support.invocation import deployed, invocation_app, pexec_url, sample
from tests.support.remote_write import RemoteWriteReceiver
from tests.support.telemetries import create_telemetry, replica_of
from tests.support.tsdb import running

ACCOUNT = "nvcf-default"


@pytest.fixture
def receiver() -> Iterator[RemoteWriteReceiver]:
    r = RemoteWriteReceiver().start()
    yield r
    r.stop()


async def exported(
    client_factory: ClientFactory, tmp_path: Path, receiver: RemoteWriteReceiver, provider: str
) -> tuple[AppClient, dict[str, Any], dict[str, Any]]:
    client = await invocation_app(
        client_factory,
        tmp_path,
        telemetry_allowlist=receiver.hostport,
        telemetry_export_interval=0.2,
        telemetry_export_timeout=1.0,
    )
    telemetry = await create_telemetry(
        client,
        endpoint=receiver.url,
        provider=provider,
        types=["METRICS"],
        secret={"name": "prom", "value": "rw-key"},
    )
    fn = await deployed(client, telemetries={"metricsTelemetryId": telemetry["telemetryId"]})
    return client, telemetry, fn


async def invoke_and_flush(client: AppClient, fn: dict[str, Any], n: int) -> None:
    for _ in range(n):
        resp = await client.post(pexec_url(fn), json={"x": 1})
        assert resp.status_code == 200, resp.text
    exports = client.app.state.telemetry_exports
    assert exports is not None
    await exports.flush()


@pytest.mark.parametrize("provider", ["PROMETHEUS", "VICTORIAMETRICS"])
async def test_a_hundred_invocations_arrive_as_a_hundred(
    client_factory: ClientFactory, tmp_path: Path, receiver: RemoteWriteReceiver, provider: str
) -> None:
    client, telemetry, fn = await exported(client_factory, tmp_path, receiver, provider)
    await invoke_and_flush(client, fn, 100)

    labels = {
        "job": "nvcf",
        "nvcf_account": ACCOUNT,
        "nvcf_function_id": fn["id"],
        "nvcf_function_version_id": fn["versionId"],
    }
    mine = {"nvcf_function_id": fn["id"]}
    total = receiver.samples("nvcf_function_invocations_total", **mine)[-1]
    assert total.value == 100  # cumulative: the last write holds the total
    mine_only = {**labels, "nvcf_replica": replica_of(client)}  # what this replica counted
    assert total.labels == {
        "__name__": "nvcf_function_invocations_total",
        **mine_only,
        "outcome": "fulfilled",
    }
    duration = "nvcf_function_invocation_duration_seconds"
    assert receiver.samples(f"{duration}_count", **mine)[-1].value == 100
    assert receiver.samples(f"{duration}_bucket", le="+Inf", **mine)[-1].value == 100
    assert receiver.samples(f"{duration}_sum", **mine)[-1].value > 0
    depth = receiver.samples("nvcf_function_queue_depth", **mine)[-1]
    assert depth.labels == {"__name__": "nvcf_function_queue_depth", **mine_only}
    assert depth.value == 0
    for write in receiver.writes:
        assert write.headers["authorization"] == "Bearer rw-key"
        assert write.headers["content-encoding"] == "snappy"
        assert write.headers["x-prometheus-remote-write-version"] == "0.1.0"

    got = (await client.get(f"/v2/nvcf/telemetries/{telemetry['telemetryId']}")).json()
    status = got["telemetry"]["status"]
    assert "lastSuccessAt" in status and "lastError" not in status


async def test_a_refusing_endpoint_shows_why_and_counts_the_drops(
    client_factory: ClientFactory, tmp_path: Path, receiver: RemoteWriteReceiver
) -> None:
    receiver.status = 401  # from the first export on (gauges are sent before any invocation)
    client, telemetry, fn = await exported(client_factory, tmp_path, receiver, "PROMETHEUS")
    await invoke_and_flush(client, fn, 3)
    got = (await client.get(f"/v2/nvcf/telemetries/{telemetry['telemetryId']}")).json()
    assert "HTTP 401" in got["telemetry"]["status"]["lastError"]
    metrics = (await client.get("/metrics")).text
    assert sample(metrics, "nvcf_telemetry_dropped_total", reason="export_failed") >= 1
    assert not receiver.writes


@pytest.mark.parametrize("name", ["prometheus", "victoria-metrics"])
async def test_a_real_receiver_answers_promql_with_the_exact_series(
    client_factory: ClientFactory, tmp_path: Path, name: str
) -> None:
    """Debian's Prometheus (remote-write receiver on) and VictoriaMetrics take the writes; the
    series queried back with PromQL have the invocation count and exactly these labels."""
    provider = "PROMETHEUS" if name == "prometheus" else "VICTORIAMETRICS"
    with running(name) as tsdb:
        client = await invocation_app(
            client_factory,
            tmp_path,
            telemetry_allowlist=tsdb.hostport,
            telemetry_export_interval=0.2,
            telemetry_export_timeout=5.0,
        )
        telemetry = await create_telemetry(
            client,
            endpoint=tsdb.write_url,
            provider=provider,
            types=["METRICS"],
            secret={"name": "tsdb", "value": "rw-key"},
        )
        fn = await deployed(client, telemetries={"metricsTelemetryId": telemetry["telemetryId"]})
        await invoke_and_flush(client, fn, 100)

        mine = f'{{nvcf_function_id="{fn["id"]}"}}'

        async def queried(promql: str) -> list[dict[str, Any]]:
            """The series once its value is the final one (earlier exports hold less)."""

            async def found() -> list[dict[str, Any]]:
                got = await asyncio.to_thread(tsdb.query, promql)
                return got if got and float(got[0]["value"][1]) == 100 else []

            return list(await eventually(found))

        (total,) = await queried(f"nvcf_function_invocations_total{mine}")
        assert total["metric"] == {
            "__name__": "nvcf_function_invocations_total",
            "job": "nvcf",
            "nvcf_account": ACCOUNT,
            "nvcf_function_id": fn["id"],
            "nvcf_function_version_id": fn["versionId"],
            "nvcf_replica": replica_of(client),
            "outcome": "fulfilled",
        }
        assert float(total["value"][1]) == 100
        (count,) = await queried(f"nvcf_function_invocation_duration_seconds_count{mine}")
        assert float(count["value"][1]) == 100
        got = (await client.get(f"/v2/nvcf/telemetries/{telemetry['telemetryId']}")).json()
        assert "lastError" not in got["telemetry"]["status"]
