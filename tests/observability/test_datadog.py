"""A function's metrics at Datadog's series v2 intake (a double of it): the invocation count
arrives as deltas summing to the invocations, tagged exactly, the key in DD-API-KEY; a
refusing intake seen in the telemetry's status; its traces at Datadog's OTLP traces intake."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.app import AppClient, ClientFactory
from tests.support.datadog import DatadogIntake
from tests.support.invocation import deployed, invocation_app, pexec_url
from tests.support.otlp import OtlpReceiver, attributes
from tests.support.telemetries import create_telemetry, replica_of


@pytest.fixture
def intake() -> Iterator[DatadogIntake]:
    i = DatadogIntake().start()
    yield i
    i.stop()


async def exported(
    client_factory: ClientFactory, tmp_path: Path, intake: DatadogIntake
) -> tuple[AppClient, dict[str, Any], dict[str, Any]]:
    client = await invocation_app(
        client_factory,
        tmp_path,
        telemetry_allowlist=intake.hostport,
        telemetry_export_interval=0.2,
        telemetry_export_timeout=1.0,
    )
    telemetry = await create_telemetry(
        client,
        endpoint=intake.url,
        provider="DATADOG",
        types=["METRICS"],
        secret={"name": "dd", "value": "dd-api-key"},
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


async def test_invocations_arrive_as_counts(
    client_factory: ClientFactory, tmp_path: Path, intake: DatadogIntake
) -> None:
    client, telemetry, fn = await exported(client_factory, tmp_path, intake)
    await invoke_and_flush(client, fn, 25)
    await invoke_and_flush(client, fn, 25)  # a second export: a delta, not the total again

    mine = f"nvcf.function.id:{fn['id']}"
    counts = intake.series("nvcf.function.invocations", mine)
    assert sum(p["value"] for s in counts for p in s["points"]) == 50  # deltas
    assert {s["type"] for s in counts} == {1}
    assert sorted(counts[0]["tags"]) == sorted(
        [
            "nvcf.account:nvcf-default",
            mine,
            f"nvcf.function.version.id:{fn['versionId']}",
            f"nvcf.replica:{replica_of(client)}",
            "outcome:fulfilled",
            "service:nvcf",
        ]
    )
    durations = intake.series("nvcf.function.invocation.duration.count", mine)
    assert sum(p["value"] for s in durations for p in s["points"]) == 50
    depth = intake.series("nvcf.function.queue_depth", mine)
    assert depth and depth[-1]["type"] == 3 and depth[-1]["points"][0]["value"] == 0
    assert {p.headers["dd-api-key"] for p in intake.posts} == {"dd-api-key"}
    assert all("authorization" not in p.headers for p in intake.posts)

    got = (await client.get(f"/v2/nvcf/telemetries/{telemetry['telemetryId']}")).json()
    status = got["telemetry"]["status"]
    assert "lastSuccessAt" in status and "lastError" not in status


async def test_a_refusing_intake_shows_why(
    client_factory: ClientFactory, tmp_path: Path, intake: DatadogIntake
) -> None:
    client, telemetry, fn = await exported(client_factory, tmp_path, intake)
    intake.status = 403
    await invoke_and_flush(client, fn, 2)
    got = (await client.get(f"/v2/nvcf/telemetries/{telemetry['telemetryId']}")).json()
    assert "HTTP 403" in got["telemetry"]["status"]["lastError"]


async def test_traces_arrive_at_datadogs_otlp_traces_intake(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    """Datadog's traces go to its OTLP traces intake (`<intake>/v1/traces`, protobuf), the key
    in `dd-api-key`; played here by an OTLP receiver at the telemetry's intake URL."""
    receiver = OtlpReceiver().start()
    try:
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
            provider="DATADOG",
            types=["TRACES"],
            secret={"name": "dd", "value": "dd-api-key"},
        )
        fn = await deployed(client, telemetries={"tracesTelemetryId": telemetry["telemetryId"]})
        await invoke_and_flush(client, fn, 3)
    finally:
        receiver.stop()
    roots = [s for _, s in receiver.spans() if s.name == "invocation"]
    assert len(roots) == 3
    assert {attributes(s.attributes)["nvcf.function.id"] for s in roots} == {fn["id"]}
    headers = [r.headers for r in receiver.of("/v1/traces")]
    assert {h["dd-api-key"] for h in headers} == {"dd-api-key"}
    assert all("authorization" not in h for h in headers)
