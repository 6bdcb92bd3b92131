"""Telemetry endpoints over HTTP at NVCF's paths and in its shapes, on SQLite and PostgreSQL:
the key write-only and encrypted, names unique per account, every bad input a 400 naming it,
the in-use refusal, the account limit, the endpoint guard.

The tests on `client` share one app per database, each in an account of its own (`admin` is
the operator's client of the same app)."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from service.core.crypto import load_secret_box
from service.observability.models import Telemetry
from tests.support.api import CONTAINER_FN, assert_problem, bearer, new_key
from tests.support.app import AppClient, ClientFactory

pytestmark = pytest.mark.asyncio(loop_scope="module")
# the tests that build their own app run in their own loop
own_app = pytest.mark.asyncio(loop_scope="function")

T = "/v2/nvcf/telemetries"
KEY = "otlp-key-do-not-leak-5b3c9d"
#: a public address: nothing connects to it at creation
PUBLIC = "https://8.8.8.8/otlp"
BASE: dict[str, Any] = {
    "endpoint": PUBLIC,
    "protocol": "HTTP",
    "provider": "OTEL_COLLECTOR",
    "types": ["LOGS", "METRICS", "TRACES"],
    "secret": {"name": "collector", "value": KEY},
}
FIELDS = {"telemetryId", "name", "endpoint", "protocol", "provider", "types", "createdAt", "status"}


@pytest.fixture
def client(tenant_client: AppClient) -> AppClient:
    return tenant_client


@pytest.fixture
def admin(module_client: AppClient) -> AppClient:
    return module_client


def another() -> str:
    return f"team-b-{uuid.uuid4().hex[:12]}"


def body(**changes: Any) -> dict[str, Any]:
    return {**BASE, **changes}


async def create(client: httpx.AsyncClient, **changes: Any) -> dict[str, Any]:
    resp = await client.post(T, json=body(**changes))
    assert resp.status_code == 200, resp.text
    return dict(resp.json()["telemetry"])


def errors_of(resp: httpx.Response) -> dict[str, str]:
    assert_problem(resp, 400)
    return {e["field"]: e["message"] for e in resp.json()["errors"]}


async def test_create_get_list_delete_in_nvcf_shape(
    client: AppClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    made = await create(client)
    assert set(made) == FIELDS
    assert made["name"] == "collector" and made["types"] == ["LOGS", "METRICS", "TRACES"]
    assert made["protocol"] == "HTTP" and made["provider"] == "OTEL_COLLECTOR"
    assert made["status"] == {}  # nothing exported yet
    tid = made["telemetryId"]

    got = await client.get(f"{T}/{tid}")
    assert got.status_code == 200 and got.json() == {"telemetry": made}
    listed = await client.get(T)
    assert listed.status_code == 200 and listed.json() == {"telemetries": [made]}
    for resp in (got, listed):
        assert KEY not in resp.text
    assert KEY not in caplog.text

    deleted = await client.delete(f"{T}/{tid}")
    assert deleted.status_code == 204 and deleted.content == b""
    assert_problem(await client.get(f"{T}/{tid}"), 404)
    assert (await client.get(T)).json() == {"telemetries": []}


async def test_the_key_is_stored_encrypted(client: AppClient) -> None:
    made = await create(client)
    async with client.app.state.sessionmaker() as session:
        row = (
            await session.execute(
                select(Telemetry).where(Telemetry.id == uuid.UUID(made["telemetryId"]))
            )
        ).scalar_one()
    assert KEY not in row.secret_ciphertext
    box = load_secret_box(client.app.state.settings)
    assert box.decrypt(row.secret_ciphertext) == KEY
    assert str(row.id) == made["telemetryId"]


async def test_enumerations_are_read_in_any_case_and_types_deduplicated(
    client: AppClient,
) -> None:
    made = await create(client, protocol="grpc", provider="otel_collector", types=["traces"] * 2)
    assert (made["protocol"], made["provider"], made["types"]) == (
        "GRPC",
        "OTEL_COLLECTOR",
        ["TRACES"],
    )


async def test_names_are_unique_per_account(client: AppClient, admin: AppClient) -> None:
    first = await create(client)
    again = await client.post(T, json=body())
    assert_problem(again, 409)
    assert first["telemetryId"] in again.json()["detail"]
    other = await new_key(admin, ["manage_telemetries"], account=another())
    theirs = await client.post(T, json=body(), headers=bearer(other))
    assert theirs.status_code == 200, theirs.text


async def test_bad_input_is_a_400_naming_every_field(client: AppClient) -> None:
    resp = await client.post(
        T,
        json={
            "endpoint": "",
            "protocol": "UDP",
            "provider": "NEW_RELIC",
            "types": [],
            "secret": {"name": "-x", "value": ""},
        },
    )
    errors = errors_of(resp)
    assert set(errors) == {
        "endpoint",
        "protocol",
        "provider",
        "types",
        "secret.name",
        "secret.value",
    }
    assert "HTTP, GRPC" in errors["protocol"] and "'UDP'" in errors["protocol"]
    assert "OTEL_COLLECTOR" in errors["provider"]
    unknown_type = errors_of(await client.post(T, json=body(types=["LOGS", "EVENTS"])))
    assert "LOGS, METRICS, TRACES" in unknown_type["types[1]"]
    missing = errors_of(await client.post(T, json={}))
    assert {"endpoint", "protocol", "provider", "types", "secret"} <= set(missing)
    assert (await client.get(T)).json() == {"telemetries": []}


async def test_a_provider_without_a_wire_is_refused_naming_the_supported(
    client: AppClient,
) -> None:
    errors = errors_of(await client.post(T, json=body(provider="SPLUNK")))
    assert set(errors) == {"provider"}
    for supported in (
        "OTEL_COLLECTOR",
        "GRAFANA_CLOUD",
        "PROMETHEUS",
        "VICTORIAMETRICS",
        "DATADOG",
    ):
        assert supported in errors["provider"]


async def test_each_wire_takes_its_protocols_and_types(client: AppClient) -> None:
    errors = errors_of(
        await client.post(T, json=body(provider="PROMETHEUS", protocol="GRPC", types=["LOGS"]))
    )
    assert set(errors) == {"protocol", "types"}
    assert "HTTP" in errors["protocol"] and "METRICS" in errors["types"]
    datadog = errors_of(
        await client.post(T, json=body(provider="DATADOG", protocol="GRPC", types=["TRACES"]))
    )
    assert set(datadog) == {"protocol"}
    made = await create(
        client,
        provider="VICTORIAMETRICS",
        types=["METRICS"],
        endpoint="https://8.8.8.8/api/v1/write",
    )
    assert made["provider"] == "VICTORIAMETRICS"


async def test_datadog_takes_a_site_name(client: AppClient) -> None:
    made = await create(
        client, provider="DATADOG", types=["LOGS", "METRICS"], endpoint="datadoghq.eu"
    )
    assert made["endpoint"] == "datadoghq.eu"
    errors = errors_of(
        await client.post(
            T, json=body(provider="DATADOG", types=["LOGS"], endpoint="datadog.example")
        )
    )
    assert "datadoghq.com" in errors["endpoint"]


async def test_grafana_cloud_takes_instance_id_and_token(client: AppClient) -> None:
    errors = errors_of(await client.post(T, json=body(provider="GRAFANA_CLOUD")))
    assert set(errors) == {"secret.value"} and "instanceId:token" in errors["secret.value"]
    assert KEY not in str(errors)
    made = await create(
        client, provider="GRAFANA_CLOUD", secret={"name": "g", "value": "123:glc_x"}
    )
    assert made["provider"] == "GRAFANA_CLOUD"


@pytest.mark.parametrize(
    ("endpoint", "kind"),
    [
        ("http://127.0.0.1:4318", "loopback"),
        ("http://169.254.169.254/latest", "link-local"),
        ("https://10.1.2.3/otlp", "private"),
        ("http://localhost:4318", "loopback"),
        ("http://[::1]:4318", "loopback"),
    ],
)
async def test_endpoints_on_the_platforms_network_are_refused(
    client: AppClient, endpoint: str, kind: str
) -> None:
    errors = errors_of(await client.post(T, json=body(endpoint=endpoint)))
    assert set(errors) == {"endpoint"}
    assert kind in errors["endpoint"] and "NVCF_TELEMETRY_ALLOWLIST" in errors["endpoint"]


@own_app
async def test_the_operator_allows_listed_private_endpoints(client_factory: ClientFactory) -> None:
    client = await client_factory(telemetry_allowlist="127.0.0.1:4318,localhost")
    assert (await create(client, endpoint="http://127.0.0.1:4318"))["endpoint"]
    assert await create(
        client, endpoint="http://localhost:9999", secret={"name": "b", "value": "k"}
    )
    other_port = await client.post(
        T, json=body(endpoint="http://127.0.0.1:4319", secret={"name": "c", "value": "k"})
    )
    assert "endpoint" in errors_of(other_port)


@pytest.mark.parametrize(
    "endpoint",
    ["ftp://8.8.8.8/x", "https://user:pw@8.8.8.8/otlp", "https://8.8.8.8/otlp?x=1", "otlp"],
)
async def test_an_endpoint_must_be_a_plain_http_url(client: AppClient, endpoint: str) -> None:
    errors = errors_of(await client.post(T, json=body(endpoint=endpoint)))
    assert set(errors) == {"endpoint"}
    assert "pw" not in errors["endpoint"]


@own_app
async def test_the_account_limit(client_factory: ClientFactory) -> None:
    client = await client_factory(quota_telemetries=2)
    for name in ("a", "b"):
        await create(client, secret={"name": name, "value": "k"})
    resp = await client.post(T, json=body(secret={"name": "c", "value": "k"}))
    problem = assert_problem(resp, 400)
    assert "number of telemetries allowed: 2" in str(problem["detail"])
    assert "NVCF_QUOTA_TELEMETRIES" in str(problem["errors"])
    assert len((await client.get(T)).json()["telemetries"]) == 2


async def test_the_key_is_replaced_under_the_telemetrys_name(client: AppClient) -> None:
    made = await create(client)
    url = f"/v2/nvcf/secrets/telemetries/{made['telemetryId']}"
    resp = await client.put(url, json={"secret": {"name": "collector", "value": "new-key"}})
    assert resp.status_code == 204, resp.text
    async with client.app.state.sessionmaker() as session:
        row = (
            await session.execute(
                select(Telemetry).where(Telemetry.id == uuid.UUID(made["telemetryId"]))
            )
        ).scalar_one()
    assert load_secret_box(client.app.state.settings).decrypt(row.secret_ciphertext) == "new-key"
    renamed = errors_of(await client.put(url, json={"secret": {"name": "other", "value": "k"}}))
    assert set(renamed) == {"secret.name"}
    assert set(errors_of(await client.put(url, json={}))) == {"secret"}
    missing = await client.put(
        f"/v2/nvcf/secrets/telemetries/{uuid.uuid4()}",
        json={"secret": {"name": "collector", "value": "k"}},
    )
    assert_problem(missing, 404)


async def test_another_accounts_telemetry_is_not_found(client: AppClient, admin: AppClient) -> None:
    made = await create(client)
    other = bearer(
        await new_key(admin, ["manage_telemetries", "update_secrets"], account=another())
    )
    tid = made["telemetryId"]
    assert_problem(await client.get(f"{T}/{tid}", headers=other), 404)
    assert_problem(await client.delete(f"{T}/{tid}", headers=other), 404)
    put = await client.put(
        f"/v2/nvcf/secrets/telemetries/{tid}",
        json={"secret": {"name": "collector", "value": "k"}},
        headers=other,
    )
    assert_problem(put, 404)
    assert (await client.get(T, headers=other)).json() == {"telemetries": []}
    assert (await client.get(f"{T}/{tid}")).status_code == 200


async def test_the_scopes_are_nvcfs(client: AppClient, admin: AppClient, tenant: str) -> None:
    made = await create(client)
    without = bearer(await new_key(admin, ["list_functions", "update_secrets"], account=tenant))
    assert_problem(await client.get(T, headers=without), 403)
    assert_problem(await client.post(T, json=body(), headers=without), 403)
    secrets_only = await client.put(
        f"/v2/nvcf/secrets/telemetries/{made['telemetryId']}",
        json={"secret": {"name": "collector", "value": "k"}},
        headers=without,
    )
    assert secrets_only.status_code == 204
    manager = bearer(await new_key(admin, ["manage_telemetries"], account=tenant))
    put = await client.put(
        f"/v2/nvcf/secrets/telemetries/{made['telemetryId']}",
        json={"secret": {"name": "collector", "value": "k"}},
        headers=manager,
    )
    assert_problem(put, 403)


async def test_a_telemetry_named_by_a_function_version_is_not_deleted(client: AppClient) -> None:
    made = await create(client)
    tid = made["telemetryId"]
    fn = await client.post(
        "/v2/nvcf/functions", json={**CONTAINER_FN, "telemetries": {"logsTelemetryId": tid}}
    )
    assert fn.status_code == 200, fn.text
    resp = await client.delete(f"{T}/{tid}")
    problem = assert_problem(resp, 400)
    function = fn.json()["function"]
    assert function["id"] in str(problem["detail"]) and function["versionId"] in str(
        problem["detail"]
    )
    assert (await client.get(f"{T}/{tid}")).status_code == 200
    gone = await client.delete(
        f"/v2/nvcf/functions/{function['id']}/versions/{function['versionId']}"
    )
    assert gone.status_code == 204, gone.text
    assert (await client.delete(f"{T}/{tid}")).status_code == 204


async def test_bad_path_ids_are_400(client: AppClient) -> None:
    errors = errors_of(await client.get(f"{T}/not-a-uuid"))
    assert set(errors) == {"telemetryId"}


async def test_grafana_clouds_key_as_ngcsdk_sends_it_is_stored_as_its_basic_auth_login(
    client: AppClient,
) -> None:
    grafana = {"provider": "GRAFANA_CLOUD", "endpoint": "https://8.8.8.8/otlp"}
    made = await create(
        client, **grafana, secret={"name": "g", "value": {"instanceId": "123456", "apiKey": KEY}}
    )
    async with client.app.state.sessionmaker() as session:
        row = await session.get(Telemetry, uuid.UUID(made["telemetryId"]))
    assert row is not None
    box = load_secret_box(client.app.state.settings)
    assert box.decrypt(row.secret_ciphertext) == f"123456:{KEY}"

    resp = await client.post(
        T, json=body(**grafana, secret={"name": "h", "value": {"instanceId": "123456"}})
    )
    assert "instanceId" in errors_of(resp)["secret.value"]


async def test_a_key_given_as_an_object_where_a_token_is_sent_is_refused(
    client: AppClient,
) -> None:
    value = {"clientKey": KEY, "clientCert": "-----BEGIN CERTIFICATE-----"}
    resp = await client.post(
        T,
        json=body(
            provider="OTEL_COLLECTOR",
            endpoint="https://8.8.8.8/otlp",
            types=["METRICS"],
            secret={"name": "p", "value": value},
        ),
    )
    message = errors_of(resp)["secret.value"]
    assert "OTEL_COLLECTOR takes its key as a string" in message and KEY not in resp.text
    # PROMETHEUS takes client certificates (tests/observability/test_mtls.py): these are not
    resp = await client.post(
        T,
        json=body(
            provider="PROMETHEUS",
            endpoint="https://8.8.8.8/api/v1/write",
            types=["METRICS"],
            secret={"name": "p", "value": value},
        ),
    )
    errors = errors_of(resp)
    assert errors["secret.value.clientCert"] == "is not a PEM certificate"
    assert errors["secret.value.clientKey"] == "is not an unencrypted PEM private key"
    assert KEY not in resp.text
    assert (await client.get(T)).json() == {"telemetries": []}
