"""Creating helm functions through the HTTP API against real local registries (api.md §2.1,
helm.md §1–§4): digests, findings, every rule as a 400, credentials, registry failures.

The tests on `client` share one app per database (the anonymous registry allow-listed), each
in an account of its own."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import httpx
import pytest

from tests.support.app import AppClient, ClientFactory
from tests.support.charts import FAILING, REGISTRY_USER, PushCorpus
from tests.support.nvcf_cli import add_request
from tests.support.registry import RegistryServer

pytestmark = [pytest.mark.registry, pytest.mark.asyncio(loop_scope="module")]
# the tests that build their own apps run in their own loop
own_app = pytest.mark.asyncio(loop_scope="function")

BASE = "inference-ok"
_names = itertools.count()


def helm_fn(url: str, **changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": f"helm-fn-{next(_names)}",
        "inferenceUrl": "/v2/models/m/infer",
        "inferencePort": 8000,
        "helmChart": url,
        "helmChartServiceName": "entrypoint",
    }
    body.update(changes)
    return body


@pytest.fixture(scope="module")
def module_settings(anon_registry: RegistryServer) -> dict[str, Any]:
    return {"registry_allowlist": anon_registry.host, "insecure_registries": anon_registry.host}


@pytest.fixture
def client(tenant_client: AppClient) -> AppClient:
    return tenant_client


async def helm_client(client_factory: ClientFactory, *servers: RegistryServer) -> AppClient:
    hosts = ",".join(s.host for s in servers)
    return await client_factory(registry_allowlist=hosts, insecure_registries=hosts)


async def stored_functions(client: AppClient) -> list[dict[str, Any]]:
    resp = await client.get("/v2/nvcf/functions")
    assert resp.status_code == 200, resp.text
    functions: list[dict[str, Any]] = resp.json()["functions"]
    return functions


def rules(findings: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    return [(f["rule"], f.get("object")) for f in findings]


async def test_create_from_passing_chart_in_both_url_forms(
    client: AppClient, anon_registry: RegistryServer, push_corpus: PushCorpus
) -> None:
    ok = push_corpus(anon_registry, BASE)
    resp = await client.post("/v2/nvcf/functions", json=helm_fn(ok.file_url))
    assert resp.status_code == 200, resp.text
    fn = resp.json()["function"]
    assert fn["helmChartDigest"] == ok.digest and ok.digest.startswith("sha256:")
    assert fn["status"] == "INACTIVE"
    assert [(f["rule"], f["severity"], f["field"]) for f in fn["findings"]] == [
        ("modified", "info", "spec.template.spec.automountServiceAccountToken")
    ]

    # a second version from the plain OCI reference form, of a chart with warnings
    hooks = push_corpus(anon_registry, "hook-skipped")
    resp = await client.post(
        f"/v2/nvcf/functions/{fn['id']}/versions", json=helm_fn(hooks.ref_url, name=fn["name"])
    )
    assert resp.status_code == 200, resp.text
    second = resp.json()["function"]
    assert second["helmChartDigest"] == hooks.digest
    assert [(f["rule"], f["severity"]) for f in second["findings"]] == [
        ("hook-skipped", "warning"),
        ("modified", "info"),
    ]

    # findings and the digest are stored with the version
    got = await client.get(f"/v2/nvcf/functions/{fn['id']}/versions/{second['versionId']}")
    assert got.status_code == 200, got.text
    assert got.json()["function"]["findings"] == second["findings"]
    assert got.json()["function"]["helmChartDigest"] == hooks.digest
    assert got.json()["function"]["findings"][0]["object"] == "batch/v1/Job/mini-service-migrate"


async def test_every_failing_chart_is_a_400_with_exact_rules_and_nothing_stored(
    client: AppClient, anon_registry: RegistryServer, push_corpus: PushCorpus
) -> None:
    failing = {
        name: [(rule, obj) for rule, severity, obj, _ in rows if severity == "error"]
        for name, rows in FAILING.items()
    }
    failing = {name: errors for name, errors in failing.items() if errors}
    failing["bad-template"] = [("render-error", None)]
    failing["library-chart"] = [("library-chart", None)]
    for name, expected in sorted(failing.items()):
        chart = push_corpus(anon_registry, name)
        resp = await client.post("/v2/nvcf/functions", json=helm_fn(chart.file_url))
        assert resp.status_code == 400, (name, resp.text)
        problem = resp.json()
        assert [(e["rule"], e.get("object")) for e in problem["errors"]] == expected, name
        assert all(e["field"] == "helmChart" for e in problem["errors"])
        assert all(e["message"] for e in problem["errors"])
        assert chart.file_url in problem["detail"]
    # the field path inside the object is kept too
    volume = push_corpus(anon_registry, "volume-type")
    resp = await client.post("/v2/nvcf/functions", json=helm_fn(volume.ref_url))
    assert [e["path"] for e in resp.json()["errors"]] == [
        "spec.volumes[2].hostPath",
        "spec.volumes[3].projected.sources[1].serviceAccountToken",
    ]
    # Helm's own message, with template file and line
    broken = push_corpus(anon_registry, "bad-template")
    resp = await client.post("/v2/nvcf/functions", json=helm_fn(broken.file_url))
    assert "inference-test/templates/broken.yaml:6" in resp.json()["errors"][0]["message"]
    assert await stored_functions(client) == []


@own_app
async def test_enforced_security_turns_warnings_into_errors(
    client_factory: ClientFactory, anon_registry: RegistryServer, push_corpus: PushCorpus
) -> None:
    hosts = anon_registry.host
    chart = push_corpus(anon_registry, "security")
    relaxed = await client_factory(registry_allowlist=hosts, insecure_registries=hosts)
    resp = await relaxed.post("/v2/nvcf/functions", json=helm_fn(chart.file_url))
    assert resp.status_code == 200, resp.text
    warnings = [f for f in resp.json()["function"]["findings"] if f["severity"] == "warning"]
    assert len(warnings) == len(FAILING["security"])
    strict = await client_factory(
        registry_allowlist=hosts, insecure_registries=hosts, helm_enforce_security=True
    )
    resp = await strict.post("/v2/nvcf/functions", json=helm_fn(chart.file_url))
    assert resp.status_code == 400, resp.text
    expected = [(rule, obj) for rule, _, obj, _ in FAILING["security"]]
    assert rules(resp.json()["errors"]) == expected
    assert len(await stored_functions(strict)) == 1  # both apps share one database


async def test_multi_node_chart_whose_service_selects_pod_index_is_accepted(
    client: AppClient, anon_registry: RegistryServer, push_corpus: PushCorpus
) -> None:
    """NVIDIA's multi-node samples send inference to the leader, pod 0 of a StatefulSet, by
    selecting `apps.kubernetes.io/pod-index` (set on the pods by the controller, not in the
    template)."""
    chart = push_corpus(anon_registry, "multi-node-statefulset")
    resp = await client.post("/v2/nvcf/functions", json=helm_fn(chart.file_url))
    assert resp.status_code == 200, resp.text
    findings = resp.json()["function"]["findings"]
    assert [f for f in findings if f["severity"] != "info"] == []


@own_app
async def test_url_rules_are_checked_before_any_network(client_factory: ClientFactory) -> None:
    client = await client_factory()
    # nothing listens on the discard port: reaching the network would be a 502
    resp = await client.post(
        "/v2/nvcf/functions", json=helm_fn("oci://127.0.0.1:9/acme/inference-test-v1-test.tgz")
    )
    assert resp.status_code == 400, resp.text
    [error] = resp.json()["errors"]
    assert error["field"] == "helmChart" and "may not contain '-'" in error["message"]
    resp = await client.post(
        "/v2/nvcf/functions", json=helm_fn("oci://127.0.0.1:9/acme/inference_test-1.0.0.tgz")
    )
    assert resp.status_code == 400, resp.text
    assert "underscores are not allowed" in resp.json()["errors"][0]["message"]
    assert await stored_functions(client) == []


@own_app
async def test_private_address_refused_unless_allowlisted(
    client_factory: ClientFactory, anon_registry: RegistryServer, push_corpus: PushCorpus
) -> None:
    chart = push_corpus(anon_registry, BASE)
    client = await client_factory(insecure_registries=anon_registry.host)
    resp = await client.post("/v2/nvcf/functions", json=helm_fn(chart.file_url))
    assert resp.status_code == 400, resp.text
    detail = resp.json()["detail"]
    assert "loopback address 127.0.0.1" in detail and "NVCF_REGISTRY_ALLOWLIST" in detail
    assert await stored_functions(client) == []


@own_app
async def test_helm_credentials_of_the_account_are_used_for_the_auth_registry(
    client_factory: ClientFactory, auth_registry: RegistryServer, push_corpus: PushCorpus
) -> None:
    """Charts are pulled with the account's HELM credentials for the host (in the shape
    nvcf-cli sends them), never with CONTAINER-only ones."""
    client = await helm_client(client_factory, auth_registry)
    chart = push_corpus(auth_registry, BASE)
    expected = f"no credential was valid to pull chart {chart.file_url}"
    credentials = "/v2/nvcf/registry-credentials"
    user, password = REGISTRY_USER

    async def create_function() -> httpx.Response:
        return await client.post("/v2/nvcf/functions", json=helm_fn(chart.file_url))

    resp = await create_function()
    assert resp.status_code == 400, resp.text
    assert resp.json()["detail"] == expected

    wrong = add_request(auth_registry.host, "intruder", "nope", ["HELM"], name="wrong")
    assert (await client.post(credentials, json=wrong)).status_code == 200
    resp = await create_function()
    assert resp.status_code == 400, resp.text
    assert resp.json()["detail"] == expected

    # the right login, but only for images: not used to pull charts
    images = add_request(auth_registry.host, user, password, ["CONTAINER"], name="images")
    assert (await client.post(credentials, json=images)).status_code == 200
    resp = await create_function()
    assert resp.status_code == 400, resp.text
    assert resp.json()["detail"] == expected
    assert await stored_functions(client) == []

    right = add_request(auth_registry.host, user, password, ["HELM"])
    assert (await client.post(credentials, json=right)).status_code == 200
    resp = await create_function()
    assert resp.status_code == 200, resp.text
    assert resp.json()["function"]["helmChartDigest"] == chart.digest
    assert password not in resp.text


async def test_missing_chart_is_a_400_naming_the_url(
    client: AppClient, anon_registry: RegistryServer
) -> None:
    url = f"oci://{anon_registry.host}/nowhere/absent-chart-1.0.0.tgz"
    resp = await client.post("/v2/nvcf/functions", json=helm_fn(url))
    assert resp.status_code == 400, resp.text
    assert resp.json()["detail"] == (
        f"chart {url} not found: registry {anon_registry.host} has no repository "
        "'nowhere/absent-chart'"
    )


@own_app
async def test_stopped_registry_is_a_502(
    client_factory: ClientFactory,
    start_extra_registry: Any,
    push_corpus: PushCorpus,
) -> None:
    server: RegistryServer = start_extra_registry()
    chart = push_corpus(server, BASE)
    server.stop()
    client = await helm_client(client_factory, server)
    resp = await client.post("/v2/nvcf/functions", json=helm_fn(chart.file_url))
    assert resp.status_code == 502, resp.text
    assert resp.json()["detail"].startswith(f"Could not reach registry {server.host}")
    assert await stored_functions(client) == []


async def test_digest_is_pinned_when_the_tag_moves(
    client: AppClient, anon_registry: RegistryServer, push_corpus: PushCorpus, tenant: str
) -> None:
    namespace = f"pin/{next(_names)}"
    first = push_corpus(anon_registry, BASE, namespace=namespace)
    resp = await client.post("/v2/nvcf/functions", json=helm_fn(first.file_url))
    assert resp.status_code == 200, resp.text
    v1 = resp.json()["function"]
    # the same tag now holds different content
    moved = push_corpus(
        anon_registry, BASE, namespace=namespace, files={"templates/NOTES.txt": "moved\n"}
    )
    assert moved.digest != first.digest and moved.file_url == first.file_url
    resp = await client.post(
        f"/v2/nvcf/functions/{v1['id']}/versions", json=helm_fn(first.file_url, name=v1["name"])
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["function"]["helmChartDigest"] == moved.digest
    got = await client.get(f"/v2/nvcf/functions/{v1['id']}/versions/{v1['versionId']}")
    assert got.json()["function"]["helmChartDigest"] == first.digest
    # the pinned digest still renders (from the cache, without the registry)
    pipeline = client.app.state.chart_pipeline
    maker = client.app.state.sessionmaker
    async with maker() as session:
        result = await pipeline.validate(
            session,
            tenant,
            helm_chart=first.file_url,
            service_name="entrypoint",
            inference_port=8000,
            digest=first.digest,
            configuration={"replicaCount": 2},
        )
    assert result.valid and result.chart_digest == first.digest
    deployment = next(o for o in result.objects if o["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 2


async def test_concurrent_creates_of_one_chart_pull_its_blob_once(
    client: AppClient, anon_registry: RegistryServer, push_corpus: PushCorpus
) -> None:
    chart = push_corpus(
        anon_registry,
        BASE,
        namespace=f"concurrent/{next(_names)}",
        files={"templates/NOTES.txt": f"unique {next(_names)}\n"},
    )
    assert anon_registry.blob_gets(chart.layer_digest) == 0
    responses = await asyncio.gather(
        client.post("/v2/nvcf/functions", json=helm_fn(chart.file_url)),
        client.post("/v2/nvcf/functions", json=helm_fn(chart.ref_url)),
    )
    assert [r.status_code for r in responses] == [200, 200], [r.text for r in responses]
    assert {r.json()["function"]["helmChartDigest"] for r in responses} == {chart.digest}
    assert anon_registry.blob_gets(chart.layer_digest) == 1
    # and a later version of the same chart is served from the cache too
    again = await client.post("/v2/nvcf/functions", json=helm_fn(chart.file_url))
    assert again.status_code == 200, again.text
    assert anon_registry.blob_gets(chart.layer_digest) == 1


async def test_idempotency_key_replays_a_helm_create(
    client: AppClient, anon_registry: RegistryServer, push_corpus: PushCorpus
) -> None:
    chart = push_corpus(anon_registry, BASE)
    body = helm_fn(chart.file_url)
    headers = {"Idempotency-Key": f"helm-create-{next(_names)}"}
    first = await client.post("/v2/nvcf/functions", json=body, headers=headers)
    second = await client.post("/v2/nvcf/functions", json=body, headers=headers)
    assert first.status_code == second.status_code == 200, second.text
    assert second.headers.get("Idempotent-Replayed") == "true"
    assert second.json() == first.json()
    assert len(await stored_functions(client)) == 1
