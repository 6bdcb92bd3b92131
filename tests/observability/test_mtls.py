"""Client certificates as a Prometheus telemetry's key, as NVCF takes them (ngcsdk's
`{clientKey, clientCert, caFile}`): accepted and never returned, presented by the in-process
exporter to a remote-write receiver that accepts only clients with a certificate of its CA,
every bad part a 400 naming it; a client of another CA refused. Stopping the export leaves no
connection or export thread behind. (The collector's side: test_collector.py.)"""

from __future__ import annotations

import asyncio
import gc
import threading
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.api import assert_problem
from tests.support.app import AppClient, ClientFactory
from tests.support.certs import TestCa, requiring_clients
from tests.support.e2e import eventually
from tests.support.invocation import deployed, invocation_app, pexec_url
from tests.support.remote_write import RemoteWriteReceiver
from tests.support.telemetries import TELEMETRIES, create_telemetry


@pytest.fixture(scope="module")
def ca() -> TestCa:
    return TestCa()


@pytest.fixture
def receiver(ca: TestCa) -> Iterator[RemoteWriteReceiver]:
    r = RemoteWriteReceiver(tls=requiring_clients(ca)).start()
    yield r
    r.stop()


def readers() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "OtelPeriodicExportingMetricReader"}


def assert_nothing_left_open(before: set[threading.Thread]) -> None:
    """No export thread of the app runs on, and no connection is left to the garbage
    collector (its ResourceWarning an error here, not in whichever test runs next)."""
    assert readers() <= before
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        gc.collect()


async def exporting_app(
    client_factory: ClientFactory, tmp_path: Path, receiver: RemoteWriteReceiver
) -> AppClient:
    """An app exporting to `receiver` (allowed although local) every 0.2 s."""
    return await invocation_app(
        client_factory,
        tmp_path,
        telemetry_allowlist=receiver.hostport,
        telemetry_export_interval=0.2,
        telemetry_export_timeout=2.0,
    )


def certificates(ca: TestCa, **changes: Any) -> dict[str, Any]:
    client = ca.issue("tenant-exporter", server=False)
    return {"clientKey": client.key, "clientCert": client.cert, "caFile": ca.pem, **changes}


async def test_a_prometheus_telemetry_presents_its_client_certificate_to_the_receiver(
    client_factory: ClientFactory, tmp_path: Path, receiver: RemoteWriteReceiver, ca: TestCa
) -> None:
    client = await exporting_app(client_factory, tmp_path, receiver)
    before = readers()
    value = certificates(ca)
    telemetry = await create_telemetry(
        client,
        endpoint=receiver.url,
        provider="PROMETHEUS",
        types=["METRICS"],
        secret={"name": "prom-mtls", "value": value},
    )
    got = await client.get(f"{TELEMETRIES}/{telemetry['telemetryId']}")
    listed = await client.get(TELEMETRIES)
    for text in (str(telemetry), got.text, listed.text):
        assert "PRIVATE KEY" not in text and "CERTIFICATE" not in text

    fn = await deployed(client, telemetries={"metricsTelemetryId": telemetry["telemetryId"]})
    for _ in range(3):
        assert (await client.post(pexec_url(fn), json={"x": 1})).status_code == 200

    async def written() -> list[Any]:
        await client.app.state.telemetry_exports.flush()
        return receiver.samples("nvcf_function_invocations_total", nvcf_function_id=fn["id"])

    samples = await eventually(written)
    assert samples[-1].value == 3
    assert all("authorization" not in w.headers for w in receiver.writes)
    status = (await client.get(f"{TELEMETRIES}/{telemetry['telemetryId']}")).json()
    assert "lastSuccessAt" in status["telemetry"]["status"]
    await client.app.state.telemetry_exports.stop()
    assert_nothing_left_open(before)


async def test_every_bad_part_of_client_certificates_is_named_in_one_400(
    client_factory: ClientFactory, ca: TestCa
) -> None:
    client = await client_factory(reconciler_enabled=False)
    other = ca.issue("someone-else", server=False)
    body: dict[str, Any] = {
        "endpoint": "http://8.8.8.8/api/v1/write",
        "protocol": "HTTP",
        "provider": "PROMETHEUS",
        "types": ["METRICS"],
        "secret": {
            "name": "prom-mtls",
            "value": {
                "clientCert": ca.issue("tenant", server=False).cert,
                "clientKey": other.key,  # not the certificate's
                "caFile": "not a certificate",
                "password": "x",
            },
        },
    }
    problem = assert_problem(await client.post(TELEMETRIES, json=body), 400)
    fields = {e["field"]: e["message"] for e in problem["errors"]}
    assert set(fields) == {
        "endpoint",
        "secret.value.clientKey",
        "secret.value.caFile",
        "secret.value.password",
    }
    assert "https://" in fields["endpoint"]
    assert "not the private key" in fields["secret.value.clientKey"]
    assert "PRIVATE KEY" not in str(problem) and "CERTIFICATE" not in str(problem)

    body["secret"]["value"] = {"clientCert": "garbage"}
    body["endpoint"] = "https://8.8.8.8/api/v1/write"
    problem = assert_problem(await client.post(TELEMETRIES, json=body), 400)
    fields = {e["field"]: e["message"] for e in problem["errors"]}
    assert set(fields) == {"secret.value.clientCert", "secret.value.clientKey"}
    assert fields["secret.value.clientCert"] == "is not a PEM certificate"

    # a provider whose wire takes a token only refuses any object
    otlp = {**body, "provider": "OTEL_COLLECTOR", "types": ["TRACES"]}
    otlp["secret"] = {"name": "otlp-mtls", "value": certificates(ca)}
    problem = assert_problem(await client.post(TELEMETRIES, json=otlp), 400)
    assert [e["field"] for e in problem["errors"]] == ["secret.value"]
    assert (await client.get(TELEMETRIES)).json()["telemetries"] == []


async def test_lookups_of_a_telemetry_at_once_load_one_pipeline_and_stop_closes_it(
    client_factory: ClientFactory, tmp_path: Path, receiver: RemoteWriteReceiver, ca: TestCa
) -> None:
    """The export task loads a version's metrics pipeline while a record looks it up: one
    pipeline is built, and stopping the export closes its connections (the receiver keeps
    them alive) and ends its thread; none goes on exporting unowned."""
    client = await exporting_app(client_factory, tmp_path, receiver)
    telemetry = await create_telemetry(
        client,
        endpoint=receiver.url,
        provider="PROMETHEUS",
        types=["METRICS"],
        secret={"name": "prom-mtls", "value": certificates(ca)},
    )
    exports = client.app.state.telemetry_exports
    before = readers()
    tid = uuid.UUID(telemetry["telemetryId"])
    loaded = await asyncio.gather(*(exports.pipeline(tid) for _ in range(3)))
    assert loaded[0] is not None and all(p is loaded[0] for p in loaded)
    assert len(readers() - before) == 1
    await exports.stop()
    assert_nothing_left_open(before)


async def test_a_certificate_of_another_ca_is_refused_by_the_receiver_and_shown(
    client_factory: ClientFactory, tmp_path: Path, receiver: RemoteWriteReceiver, ca: TestCa
) -> None:
    client = await exporting_app(client_factory, tmp_path, receiver)
    before = readers()
    stranger = TestCa("another-ca").issue("tenant-exporter", server=False)
    value = certificates(ca, clientKey=stranger.key, clientCert=stranger.cert)
    telemetry = await create_telemetry(
        client,
        endpoint=receiver.url,
        provider="PROMETHEUS",
        types=["METRICS"],
        secret={"name": "prom-mtls", "value": value},
    )
    fn = await deployed(client, telemetries={"metricsTelemetryId": telemetry["telemetryId"]})
    assert (await client.post(pexec_url(fn), json={"x": 1})).status_code == 200

    async def failed() -> dict[str, Any]:
        await client.app.state.telemetry_exports.flush()
        got = (await client.get(f"{TELEMETRIES}/{telemetry['telemetryId']}")).json()
        return dict(got["telemetry"]["status"]) if "lastError" in str(got) else {}

    status = await eventually(failed)
    assert "lastSuccessAt" not in status and status["dropped"] >= 1
    assert receiver.writes == []
    await client.app.state.telemetry_exports.stop()
    assert_nothing_left_open(before)
