"""Telemetry endpoints for tests: a body NVCF's clients would send, made through the API."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import httpx

from service.observability.models import Telemetry

TELEMETRIES = "/v2/nvcf/telemetries"
#: a public address: nothing connects to it at creation
PUBLIC_OTLP = "https://8.8.8.8/otlp"
OTLP: dict[str, Any] = {
    "endpoint": PUBLIC_OTLP,
    "protocol": "HTTP",
    "provider": "OTEL_COLLECTOR",
    "types": ["LOGS", "METRICS", "TRACES"],
    "secret": {"name": "collector", "value": "otlp-key"},
}


async def create_telemetry(
    client: httpx.AsyncClient, headers: dict[str, str] | None = None, **changes: Any
) -> dict[str, Any]:
    resp = await client.post(TELEMETRIES, json={**OTLP, **changes}, headers=headers)
    assert resp.status_code == 200, resp.text
    return dict(resp.json()["telemetry"])


def replica_of(client: Any) -> str:
    """The replica id an in-process app labels the series it counts itself with
    (`nvcf.replica`)."""
    exports = client.app.state.telemetry_exports
    assert exports is not None and exports.settings.replica
    return str(exports.settings.replica)


def telemetry_row(
    endpoint: str, types: list[str], provider: str = "OTEL_COLLECTOR", account: str = "acct"
) -> Telemetry:
    """A stored telemetry as a pipeline is built from (OTLP over HTTP unless `provider` says
    otherwise), for tests of the pipeline on its own."""
    now = datetime.now(UTC)
    return Telemetry(
        id=uuid.uuid4(),
        account_id=account,
        name="t",
        endpoint=endpoint,
        protocol="HTTP",
        provider=provider,
        types=types,
        secret_ciphertext="",
        created_at=now,
        updated_at=now,
    )
