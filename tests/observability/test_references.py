"""A function version names telemetries at creation (NVCF's `telemetries`): each must be the
account's and receive the type it is named for, and the function's ports must stay off the
collector's reserved ports; every violation is a 400 naming it, and nothing is stored."""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from tests.support.api import CONTAINER_FN, assert_problem, bearer, create_fn, new_key
from tests.support.telemetries import create_telemetry

F = "/v2/nvcf/functions"
HEALTH = {
    "protocol": "HTTP",
    "uri": "/health",
    "port": 8000,
    "timeout": "PT10S",
    "expectedStatusCode": 200,
}


def errors_of(resp: httpx.Response) -> dict[str, str]:
    assert_problem(resp, 400)
    return {e["field"]: e["message"] for e in resp.json()["errors"]}


async def functions(client: httpx.AsyncClient) -> list[Any]:
    resp = await client.get(F)
    assert resp.status_code == 200, resp.text
    return list(resp.json()["functions"])


async def test_a_version_names_the_accounts_telemetries(client: httpx.AsyncClient) -> None:
    everything = await create_telemetry(client)
    metrics = await create_telemetry(
        client,
        provider="PROMETHEUS",
        types=["METRICS"],
        endpoint="https://8.8.8.8/api/v1/write",
        secret={"name": "prom", "value": "k"},
    )
    named = {
        "logsTelemetryId": everything["telemetryId"].upper(),
        "metricsTelemetryId": metrics["telemetryId"],
        "tracesTelemetryId": everything["telemetryId"],
    }
    fn = await create_fn(client, telemetries=named)
    assert fn["telemetries"] == {k: v.lower() for k, v in named.items()}
    # a new choice is a new version, as in NVCF
    again = await client.post(
        f"{F}/{fn['id']}/versions",
        json={**CONTAINER_FN, "telemetries": {"logsTelemetryId": everything["telemetryId"]}},
    )
    assert again.status_code == 200, again.text
    assert again.json()["function"]["telemetries"] == {"logsTelemetryId": everything["telemetryId"]}


async def test_another_accounts_or_an_unknown_telemetry_is_refused(
    client: httpx.AsyncClient,
) -> None:
    theirs = await create_telemetry(
        client, headers=bearer(await new_key(client, ["manage_telemetries"], account="team-b"))
    )
    unknown = str(uuid.uuid4())
    resp = await client.post(
        F,
        json={
            **CONTAINER_FN,
            "telemetries": {"logsTelemetryId": theirs["telemetryId"], "tracesTelemetryId": unknown},
        },
    )
    errors = errors_of(resp)
    assert errors == {
        "telemetries.logsTelemetryId": f"telemetry {theirs['telemetryId']} is not one of the "
        "account's",
        "telemetries.tracesTelemetryId": f"telemetry {unknown} is not one of the account's",
    }
    assert await functions(client) == []


async def test_a_telemetry_of_the_wrong_type_is_refused(client: httpx.AsyncClient) -> None:
    metrics_only = await create_telemetry(client, types=["METRICS"])
    tid = metrics_only["telemetryId"]
    resp = await client.post(
        F,
        json={**CONTAINER_FN, "telemetries": {"logsTelemetryId": tid, "metricsTelemetryId": tid}},
    )
    errors = errors_of(resp)
    assert set(errors) == {"telemetries.logsTelemetryId"}
    assert "receives METRICS, not LOGS" in errors["telemetries.logsTelemetryId"]
    assert await functions(client) == []


async def test_the_collectors_ports_are_reserved_when_a_telemetry_is_named(
    client: httpx.AsyncClient,
) -> None:
    tid = (await create_telemetry(client))["telemetryId"]
    body = {
        **CONTAINER_FN,
        "inferencePort": 14357,
        "health": {**HEALTH, "port": 13133},
        "telemetries": {"tracesTelemetryId": tid},
    }
    errors = errors_of(await client.post(F, json=body))
    assert set(errors) == {"inferencePort", "health.port"}
    assert "14357" in errors["inferencePort"] and "OTLP gRPC" in errors["inferencePort"]
    for port in (14358, 18888):
        refused = errors_of(await client.post(F, json={**body, "inferencePort": port}))
        assert str(port) in refused["inferencePort"]
    assert await functions(client) == []
    # without a telemetry there is no collector, and the ports are the function's
    fn = await create_fn(client, inferencePort=14357, health={**HEALTH, "port": 13133})
    assert "telemetries" not in fn
