"""Instance logs exported to a function's LOGS telemetry as they are written: OTLP logs over
HTTP and gRPC decoded by a real OTLP receiver, Datadog's logs intake; every line labelled
with function, version, instance and account, secret values masked as the logs route masks
them; nothing of another account's function, and no follower for a function that names no
logs telemetry; lines printed while the endpoint is failing are read once it is retried."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from service.backends.logs import LogLine
from service.deployments.exported import followed, paced
from service.deployments.models import Instance
from service.observability.endpoints import FIRST_BACKOFF
from tests.support.api import bearer, new_key
from tests.support.app import AppClient, ClientFactory
from tests.support.datadog import DatadogIntake
from tests.support.e2e import eventually
from tests.support.invocation import deployed, invocation_app, pexec_url
from tests.support.otlp import OtlpReceiver, attributes
from tests.support.telemetries import create_telemetry

ACCOUNT = "nvcf-default"
SECRET = "s3cr3t-token-9f8e7d"


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver().start()
    yield r
    r.stop()


@pytest.fixture
def intake() -> Iterator[DatadogIntake]:
    i = DatadogIntake().start()
    yield i
    i.stop()


async def app(client_factory: ClientFactory, tmp_path: Path, *allowed: str) -> AppClient:
    return await invocation_app(
        client_factory,
        tmp_path,
        telemetry_allowlist=",".join(allowed),
        telemetry_export_interval=0.2,
        telemetry_export_timeout=5.0,
    )


async def logged_function(
    client: AppClient, headers: dict[str, str] | None = None, **telemetry: Any
) -> dict[str, Any]:
    created = await create_telemetry(client, headers=headers, types=["LOGS"], **telemetry)
    mine = dict(client.headers)
    client.headers.update(headers or {})  # deployed() acts as the client's account
    try:
        return await deployed(
            client,
            telemetries={"logsTelemetryId": created["telemetryId"]},
            secrets=[{"name": "API_TOKEN", "value": SECRET}],
        )
    finally:
        client.headers.clear()
        client.headers.update(mine)


async def print_line(
    client: AppClient, fn: dict[str, Any], text: str, headers: dict[str, str] | None = None
) -> None:
    """Make the function's worker print `text` (the simulated worker's X-Sim-Log)."""
    resp = await client.post(
        pexec_url(fn), json={"x": 1}, headers={"X-Sim-Log": text, **(headers or {})}
    )
    assert resp.status_code == 200, resp.text


async def flushed(client: AppClient) -> None:
    exports = client.app.state.telemetry_exports
    assert exports is not None
    await exports.flush()


def labels_of(fn: dict[str, Any], account: str = ACCOUNT) -> dict[str, str]:
    return {
        "nvcf.account": account,
        "nvcf.function.id": fn["id"],
        "nvcf.function.version.id": fn["versionId"],
        "nvcf.instance.id": fn["deployment"]["instances"][0]["instanceId"],
    }


def otlp_lines(receiver: OtlpReceiver, marker: str) -> list[tuple[dict[str, Any], Any]]:
    return [(res, r) for res, r in receiver.log_records() if marker in r.body.string_value]


@pytest.mark.parametrize("protocol", ["HTTP", "GRPC"])
async def test_an_instances_lines_arrive_as_otlp_logs_labelled_and_masked(
    client_factory: ClientFactory, tmp_path: Path, receiver: OtlpReceiver, protocol: str
) -> None:
    client = await app(client_factory, tmp_path, receiver.hostport, receiver.grpc_hostport)
    endpoint = receiver.url if protocol == "HTTP" else receiver.grpc_url
    fn = await logged_function(client, endpoint=endpoint, protocol=protocol)
    await print_line(client, fn, f"connecting with token={SECRET} (marker-1)")

    async def arrived() -> list[tuple[dict[str, Any], Any]]:
        await flushed(client)
        return otlp_lines(receiver, "marker-1")

    ((resource, record),) = await eventually(arrived)
    assert record.body.string_value == "connecting with token=**** (marker-1)"
    assert resource["service.name"] == "nvcf" and resource["nvcf.account"] == ACCOUNT
    labels = attributes(record.attributes)
    assert {k: labels[k] for k in labels_of(fn)} == labels_of(fn)
    assert labels["k8s.container.name"] and labels["k8s.pod.name"]
    assert record.time_unix_nano > 0
    assert {r.headers["authorization"] for r in receiver.of("/v1/logs")} == {"Bearer otlp-key"}
    # the lines the worker wrote before and after (start-up, the request served) arrive too
    assert any("Starting" in r.body.string_value for _, r in receiver.log_records())
    assert all(SECRET not in r.body.string_value for _, r in receiver.log_records())


async def test_an_instances_lines_arrive_at_datadogs_logs_intake(
    client_factory: ClientFactory, tmp_path: Path, intake: DatadogIntake
) -> None:
    client = await app(client_factory, tmp_path, intake.hostport)
    fn = await logged_function(
        client, endpoint=intake.url, provider="DATADOG", secret={"name": "dd", "value": "dd-key"}
    )
    await print_line(client, fn, "hello datadog (marker-2)")

    async def arrived() -> list[tuple[dict[str, str], dict[str, Any]]]:
        await flushed(client)
        return [(h, e) for h, e in intake.logs() if "marker-2" in e["message"]]

    ((headers, entry),) = await eventually(arrived)
    assert headers["dd-api-key"] == "dd-key"
    assert entry["message"] == "hello datadog (marker-2)"
    assert entry["service"] == "nvcf" and entry["ddsource"] == "nvcf"
    tags = dict(t.split(":", 1) for t in entry["ddtags"].split(","))
    assert {k: tags[k] for k in labels_of(fn)} == labels_of(fn)


async def test_lines_printed_while_the_endpoint_fails_are_read_once_it_is_retried(
    client_factory: ClientFactory, tmp_path: Path, receiver: OtlpReceiver
) -> None:
    client = await app(client_factory, tmp_path, receiver.hostport)
    exports = client.app.state.telemetry_exports
    now = [1_000.0]  # the backoff's clock: it ends when the test says
    exports.settings = replace(exports.settings, clock=lambda: now[0])
    receiver.status = 401
    fn = await logged_function(client, endpoint=receiver.url)

    async def refused() -> bool:
        await flushed(client)
        return receiver.requests > 0

    await eventually(refused)  # the start-up lines, refused: the endpoint is in backoff
    receiver.status = 200
    await print_line(client, fn, "while failing (marker-6)")
    await flushed(client)
    assert otlp_lines(receiver, "marker-6") == []  # not read: it could only be dropped

    now[0] += FIRST_BACKOFF

    async def arrived() -> list[tuple[dict[str, Any], Any]]:
        await flushed(client)
        return otlp_lines(receiver, "marker-6")

    ((_, record),) = await eventually(arrived)
    assert record.body.string_value == "while failing (marker-6)"


async def test_nothing_of_another_account_and_no_follower_for_a_function_naming_none(
    client_factory: ClientFactory, tmp_path: Path, receiver: OtlpReceiver
) -> None:
    other = OtlpReceiver().start()
    try:
        client = await app(client_factory, tmp_path, receiver.hostport, other.hostport)
        scopes = [
            "register_function",
            "deploy_function",
            "list_functions",
            "invoke_function",
            "manage_telemetries",
        ]
        theirs = bearer(await new_key(client, scopes, account="team-b"))
        mine = await logged_function(client, endpoint=receiver.url)
        their = await logged_function(client, headers=theirs, endpoint=other.url)
        plain = await deployed(client)  # names no telemetry
        await print_line(client, mine, "mine (marker-3)")
        await print_line(client, their, "theirs (marker-4)", headers=theirs)
        await print_line(client, plain, "plain (marker-5)")

        async def both() -> bool:
            await flushed(client)
            return bool(otlp_lines(receiver, "marker-3") and otlp_lines(other, "marker-4"))

        await eventually(both)
        ids = {attributes(r.attributes)["nvcf.function.id"] for _, r in receiver.log_records()}
        assert ids == {mine["id"]}
        theirs_ids = {attributes(r.attributes)["nvcf.function.id"] for _, r in other.log_records()}
        assert theirs_ids == {their["id"]}
        assert {res["nvcf.account"] for res, _ in other.log_records()} == {"team-b"}

        async with client.app.state.sessionmaker() as session:
            owner = await session.scalar(
                Instance.__table__.select().with_only_columns(Instance.lease_owner).limit(1)
            )
            assert owner is not None
            instances = {
                str(f.instance_id)
                for f in await followed(session, owner, client.app.state.adapters)
            }
        assert instances == {
            mine["deployment"]["instances"][0]["instanceId"],
            their["deployment"]["instances"][0]["instanceId"],
        }
    finally:
        other.stop()


async def test_a_functions_instances_by_phase_are_exported(
    client_factory: ClientFactory, tmp_path: Path, receiver: OtlpReceiver
) -> None:
    client = await app(client_factory, tmp_path, receiver.hostport)
    telemetry = await create_telemetry(client, endpoint=receiver.url, types=["METRICS"])
    fn = await deployed(client, telemetries={"metricsTelemetryId": telemetry["telemetryId"]})
    plain = await deployed(client)  # names no telemetry

    async def running() -> dict[str, int]:
        await flushed(client)
        last: dict[str, int] = {}
        for _, point in receiver.metric_points("nvcf.function.instances"):
            labels = attributes(point.attributes)
            last[labels.pop("phase")] = point.as_int
            assert labels == {k: v for k, v in labels_of(fn).items() if k != "nvcf.instance.id"}
        return last if last.get("Running") == 1 else {}

    counts = await eventually(running)
    assert counts == {"Scheduling": 0, "Starting": 0, "Running": 1, "Degraded": 0, "Failed": 0}
    assert plain["id"] != fn["id"]


async def test_lines_printed_while_a_follower_rests_are_read_in_one_go() -> None:
    """A follower that waited for a line rests before reading on: the lines printed meanwhile
    come without another wait (one wake-up, not one a line), none lost, in order."""
    printed: asyncio.Queue[LogLine | None] = asyncio.Queue()
    waits = 0

    async def follow() -> AsyncIterator[LogLine]:
        nonlocal waits
        while True:
            if printed.empty():
                waits += 1
            line = await printed.get()
            if line is None:
                return
            yield line

    read: list[str] = []
    got = asyncio.Event()

    async def follower() -> None:
        async for line in paced(follow(), 0.05):
            read.append(line.text)
            got.set()

    async def read_up_to(n: int) -> None:
        while len(read) < n:
            await got.wait()
            got.clear()

    task = asyncio.create_task(follower())
    printed.put_nowait(LogLine("p", "c", "line 0"))
    await read_up_to(1)  # read at once: then the follower waits for the next
    printed.put_nowait(LogLine("p", "c", "line 1"))
    await read_up_to(2)  # it waited for this one: it rests now
    for n in range(2, 6):
        printed.put_nowait(LogLine("p", "c", f"line {n}"))
    printed.put_nowait(None)
    await task
    assert read == [f"line {n}" for n in range(6)]
    assert waits == 1  # lines 2 to 5 were there when it read on
