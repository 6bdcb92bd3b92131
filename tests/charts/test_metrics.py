"""The chart pipeline's metrics on `/metrics` (docs/telemetry.md): fetch and render durations,
archive and render cache lookups, and registry errors by kind from real failed pulls."""

from __future__ import annotations

from typing import Any

import pytest

from service.charts.metrics import REGISTRY_ERROR_KINDS, registry_error_kind
from service.core.errors import BadGateway, BadRequest, NotFound
from tests.support.app import AppClient, ClientFactory
from tests.support.charts import PushCorpus
from tests.support.e2e import V
from tests.support.metrics import scrape
from tests.support.registry import RegistryServer
from tests.support.server import free_port


def helm_fn(url: str, name: str = "metered") -> dict[str, Any]:
    return {
        "name": name,
        "inferenceUrl": "/infer",
        "inferencePort": 8000,
        "helmChart": url,
        "helmChartServiceName": "entrypoint",
    }


async def errors_by_kind(client: AppClient) -> dict[str, float]:
    got = await scrape(client)
    return {k: got.value("nvcf_registry_errors_total", kind=k) for k in REGISTRY_ERROR_KINDS}


@pytest.mark.registry
async def test_failed_pulls_are_counted_by_kind(
    client_factory: ClientFactory, anon_registry: RegistryServer, auth_registry: RegistryServer
) -> None:
    closed = f"127.0.0.1:{free_port()}"
    hosts = ",".join((closed, anon_registry.host, auth_registry.host))
    client = await client_factory(registry_allowlist=hosts, insecure_registries=hosts)
    assert set((await errors_by_kind(client)).values()) == {0.0}  # every kind from the start
    cases = [
        (f"oci://{closed}/charts/demo:1.0.0", 502, "unreachable"),
        ("oci://127.0.0.2/charts/demo:1.0.0", 400, "refused"),  # loopback, not allow-listed
        (f"oci://{anon_registry.host}/corpus/absent:9.9.9", 400, "not_found"),
        (f"oci://{auth_registry.host}/corpus/inference-ok:1.0.0", 400, "unauthorized"),
    ]
    for url, status, kind in cases:
        resp = await client.post(f"{V}/functions", json=helm_fn(url))
        assert resp.status_code == status, resp.text
        counted = await errors_by_kind(client)
        assert counted[kind] == 1.0, (kind, resp.json()["detail"], counted)
    assert sum(counted.values()) == len(cases)
    # a URL that is not a chart reference never reached a registry: not counted
    resp = await client.post(f"{V}/functions", json=helm_fn("ftp://example.com/chart"))
    assert resp.status_code == 400
    assert sum((await errors_by_kind(client)).values()) == len(cases)


GATEWAY = BadGateway
REQUEST = BadRequest


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (GATEWAY("Could not reach registry r to pull chart c: refused."), "unreachable"),
        (GATEWAY("Could not reach the token server t of registry r to pull c."), "unreachable"),
        (GATEWAY("Could not resolve t (named by registry r) while pulling c."), "unreachable"),
        (GATEWAY("Downloading chart c failed: the connection timed out."), "unreachable"),
        (REQUEST("The host 'h' of chart c does not resolve to any address."), "unreachable"),
        (GATEWAY("Refused to contact h (named by registry r) while pulling c"), "refused"),
        (GATEWAY("Registry r redirected to http://x while pulling chart c"), "refused"),
        (REQUEST("The host 'h' of chart c resolves to the private address a"), "refused"),
        (GATEWAY("Registry r answered 503 Service Unavailable to the m"), "upstream_status"),
        (GATEWAY("h answered 500 to the download of chart c."), "upstream_status"),
        (GATEWAY("The registry sent a manifest for chart c that is not JSON."), "invalid_response"),
        (GATEWAY("Registry r sent 3 bytes for chart c, but its manifest"), "invalid_response"),
        (REQUEST("no credential was valid to pull chart c"), "unauthorized"),
        (REQUEST("chart c not found: registry r has no tag '1'"), "not_found"),
        (REQUEST("c is not a Helm chart: it is an image index (x)."), "invalid_chart"),
        (REQUEST("Chart archive c was rejected (archive-symlink): entry"), "invalid_chart"),
        (NotFound("something else"), "other"),
        (RuntimeError("not a domain error"), "other"),
    ],
)
def test_each_pull_error_has_its_kind(error: BaseException, kind: str) -> None:
    assert registry_error_kind(error) == kind


@pytest.mark.registry
async def test_fetches_renders_and_cache_lookups_are_measured(
    client_factory: ClientFactory, anon_registry: RegistryServer, push_corpus: PushCorpus
) -> None:
    host = anon_registry.host
    client = await client_factory(registry_allowlist=host, insecure_registries=host)
    chart = push_corpus(anon_registry, "inference-ok")
    first = await client.post(f"{V}/functions", json=helm_fn(chart.ref_url, "first"))
    assert first.status_code == 200, first.text
    got = await scrape(client)
    # the archive was downloaded and rendered: misses of both caches
    assert got.value("nvcf_chart_fetch_duration_seconds_count", source="registry") == 1
    assert got.value("nvcf_chart_fetch_duration_seconds_count", source="cache") == 0
    assert got.value("nvcf_chart_cache_lookups_total", cache="archive", result="miss") == 1
    assert got.value("nvcf_chart_cache_lookups_total", cache="render", result="miss") >= 1
    renders = got.total("nvcf_chart_render_duration_seconds_count")
    assert (
        renders >= 1
        and got.value("nvcf_chart_render_duration_seconds_count", helm_path="failed") == 0
    )

    # the same chart again: the archive comes from the disk cache, the checked render from memory
    second = await client.post(f"{V}/functions", json=helm_fn(chart.ref_url, "second"))
    assert second.status_code == 200, second.text
    got = await scrape(client)
    assert got.value("nvcf_chart_fetch_duration_seconds_count", source="cache") == 1
    assert got.value("nvcf_chart_cache_lookups_total", cache="archive", result="hit") == 1
    assert got.value("nvcf_chart_cache_lookups_total", cache="render", result="hit") == 1
    assert got.total("nvcf_chart_render_duration_seconds_count") == renders  # no new render
    assert got.total("nvcf_registry_errors_total") == 0
