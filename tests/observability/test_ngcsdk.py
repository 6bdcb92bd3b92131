"""ngcsdk's own `cloud_function.telemetry_endpoints` (the installed package, unmodified) against
the server over a real connection: create (an OTEL_COLLECTOR key, and GRAFANA_CLOUD's
instance and key, which ngcsdk sends as an object, and PROMETHEUS's client certificates, also an
object), list, remove, over the org-scoped paths
(`/v2/orgs/{org}/nvcf/telemetries`). ngcsdk is synchronous: it runs in a thread while the
server answers on this event loop."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from typing import Any

import pytest

from service.core import tls
from service.core.server import ConnectionLimits
from tests.support.api import bearer, new_key
from tests.support.app import AppClient
from tests.support.certs import TestCa
from tests.support.server import in_loop_server

LIMITS = ConnectionLimits(
    header_timeout=10, body_timeout=10, keepalive_timeout=5, max_connections=10
)
KEY = "otlp-key-never-shown-1c4e"
ORG = "acme"


def sdk_session(key: str, client_tls: tuple[str, str, str]) -> dict[str, Any]:
    """Create three endpoints, list, delete one, list again: what ngcsdk's calls return."""
    import ngcsdk  # type: ignore[import-untyped]  # ngcsdk ships no type hints

    client = ngcsdk.Client()
    client.configure(api_key=key, org_name=ORG)
    endpoints = client.cloud_function.telemetry_endpoints
    made = endpoints.create(
        name="collector",
        endpoint="https://8.8.8.8/otlp",
        protocol="HTTP",
        provider="OTEL_COLLECTOR",
        types=["LOGS", "METRICS", "TRACES"],
        key=KEY,
    )
    grafana = endpoints.create(
        name="grafana",
        endpoint="https://8.8.4.4/otlp",
        protocol="GRPC",
        provider="GRAFANA_CLOUD",
        types=["METRICS", "TRACES"],
        key=KEY,
        instance="123456",
    )
    client_key, client_cert, ca = client_tls
    endpoints.create(
        name="prometheus",
        endpoint="https://8.8.8.8/api/v1/write",
        protocol="HTTP",
        provider="PROMETHEUS",
        types=["METRICS"],
        key=client_key,
        client_cert=client_cert,
        self_cert=ca,
    )
    listed = endpoints.list()
    endpoints.delete(made.telemetry.telemetryId)
    after = endpoints.list()
    client.connection.cas_session_obj.close()  # its kept-alive connection would hold the server
    return {
        "made": made.telemetry,
        "grafana": grafana.telemetry.telemetryId,
        "listed": sorted(t.name for t in listed.telemetries),
        "after": [(t.telemetryId, t.name) for t in after.telemetries],
    }


# once: ngcsdk reads its URL when first imported (the routes' databases are test_router's)
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_ngcsdk_creates_lists_and_removes_telemetry_endpoints(
    client: AppClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if importlib.util.find_spec("ngcsdk") is None:
        pytest.skip("ngcsdk is not installed (the dev extra installs it)")
    key = await new_key(client, ["manage_telemetries"], account=ORG)
    cert_pem, key_pem = tls.generate(["127.0.0.1"])
    cert, private = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_bytes(cert_pem)
    private.write_bytes(key_pem)
    async with in_loop_server(client.app, LIMITS, tls=(cert, private)) as server:
        # ngcsdk reads its URL when imported and speaks HTTPS only
        monkeypatch.setenv("NGC_CLI_API_URL", f"https://127.0.0.1:{server.config.port}")
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(cert))
        monkeypatch.setenv("NGC_CLI_HOME", str(tmp_path))
        monkeypatch.setenv("HOME", str(tmp_path))
        ca = TestCa()
        issued = ca.issue("tenant-exporter", server=False)
        seen = await asyncio.to_thread(sdk_session, key, (issued.key, issued.cert, ca.pem))

    made = dict(seen["made"])
    assert made["name"] == "collector" and made["provider"] == "OTEL_COLLECTOR"
    assert made["types"] == ["LOGS", "METRICS", "TRACES"]
    assert seen["listed"] == ["collector", "grafana", "prometheus"]
    assert [name for _, name in seen["after"]] == ["grafana", "prometheus"]
    listed = await client.get("/v2/nvcf/telemetries", headers=bearer(key))
    assert KEY not in listed.text and "PRIVATE KEY" not in listed.text
    assert [t["name"] for t in listed.json()["telemetries"]] == ["grafana", "prometheus"]
