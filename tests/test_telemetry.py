"""The metrics as a whole (docs/telemetry.md): the dashboard names only metrics a scrape has,
docs/telemetry.md documents exactly the metrics a scrape has, and each application keeps its
own metrics however many share the process."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import prometheus_client

from tests.support.api import assert_problem, bearer, new_key
from tests.support.app import ADMIN_KEY, AppClient, ClientFactory
from tests.support.invocation import deployed, invocation_app, pexec_url, sample
from tests.support.metrics import scrape

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "grafana" / "nvcf-dashboard.json"
DOC = ROOT / "docs" / "telemetry.md"
METRIC = re.compile(r"\bnvcf_[a-z0-9_]+")
#: what prometheus-client adds to each counter and histogram family
SUFFIXES = ("_total", "_created", "_bucket", "_count", "_sum")


def expressions(node: Any) -> list[str]:
    """Every PromQL `expr` anywhere in the dashboard."""
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return found + [e for v in node.values() for e in expressions(v)]
    if isinstance(node, list):
        return [e for v in node for e in expressions(v)]
    return []


def family(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


async def test_every_metric_of_the_dashboard_is_in_a_scrape(client: Any) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = expressions(dashboard)
    assert len(exprs) >= 10
    referenced = {m for e in exprs for m in METRIC.findall(e)}
    assert (await client.get("/health")).status_code == 200  # the HTTP series exist after one
    got = await scrape(client)
    exported = {family(n) for n in got.families}  # declared, with or without samples yet
    # every metric it shows exists (labelled families have no samples before their first
    # observation, so families are compared) ...
    assert {family(m) for m in referenced} <= exported
    # ... and it shows every family the service exports
    assert {family(m) for m in referenced} >= exported


async def test_the_documentation_lists_exactly_the_exported_metrics(client: Any) -> None:
    documented = {
        m.group(1) for m in re.finditer(r"^\| `(nvcf_[a-z0-9_]+)` \|", DOC.read_text(), re.M)
    }
    got = await scrape(client)
    # as scraped: counters with their `_total`
    exported = {
        name + "_total" if kind == "counter" else name
        for name, kind in got.families.items()
        if name.startswith("nvcf_") and family(name) + "_created" != name
    }
    assert documented == exported


async def test_apps_in_one_process_keep_their_own_metrics(client_factory: ClientFactory) -> None:
    first = await client_factory()
    second = await client_factory()
    for _ in range(3):
        assert (await first.get("/health")).status_code == 200
    route = {"method": "GET", "route": "/health", "status": "200"}
    assert (await scrape(first)).value("nvcf_http_requests_total", **route) == 3
    assert (await scrape(second)).value("nvcf_http_requests_total", **route) == 0
    assert first.app.state.telemetry.metrics.registry is not (
        second.app.state.telemetry.metrics.registry
    )


async def test_prometheus_clients_switch_drops_the_created_series(client: Any) -> None:
    """The request families are prometheus-client's own: its switch (what
    PROMETHEUS_DISABLE_CREATED_SERIES=true sets at start) drops their `_created` samples."""
    assert (await client.get("/health")).status_code == 200
    assert "nvcf_http_requests_created{" in (await client.get("/metrics")).text
    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]  # unannotated there
    try:
        text = (await client.get("/metrics")).text
    finally:
        prometheus_client.enable_created_metrics()  # type: ignore[no-untyped-call]  # unannotated there
    assert 'nvcf_http_requests_total{method="GET",route="/health",status="200"}' in text
    assert "_created" not in text


TOKEN = "metrics-" + "t" * 40


async def test_the_series_that_name_tenants_objects_are_the_operators(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    """Anyone reaching the port reads the service's own metrics; the per-function ones need
    NVCF_METRICS_TOKEN or an operator key; a tenant's key or a wrong token is refused."""
    client = await invocation_app(client_factory, tmp_path, metrics_token=TOKEN)
    fn = await deployed(client)
    assert (await client.post(pexec_url(fn), json={})).status_code == 200
    tenant = await new_key(client, ["invoke_function", "list_functions"])
    # the operator: the bootstrap key (admin:accounts), or the scraper's token
    for credential in (ADMIN_KEY, TOKEN):
        full = await client.get("/metrics", headers=bearer(credential))
        assert full.status_code == 200
        assert sample(full.text, "nvcf_invocation_requests_total", function_id=fn["id"]) == 1
        assert f'version_id="{fn["versionId"]}"' in full.text
    # no credential: every family but those naming a tenant's objects
    anonymous = await client.get("/metrics", headers={"Authorization": ""})
    assert anonymous.status_code == 200
    assert "function_id=" not in anonymous.text and "version_id=" not in anonymous.text
    assert fn["id"] not in anonymous.text and fn["versionId"] not in anonymous.text
    assert "nvcf_http_requests_total" in anonymous.text
    assert "nvcf_function_versions" in anonymous.text
    # any other credential is refused, saying why
    refused = await client.get("/metrics", headers=bearer(tenant))
    assert "admin:accounts" in str(assert_problem(refused, 403)["detail"])
    for wrong in ("metrics-" + "x" * 40, "nvapi-" + "x" * 40):
        assert_problem(await client.get("/metrics", headers=bearer(wrong)), 401)


async def test_without_a_token_only_an_operator_key_reads_the_tenants_series(
    client: AppClient,
) -> None:
    assert (await client.get("/metrics")).status_code == 200  # the bootstrap key
    resp = await client.get("/metrics", headers=bearer("metrics-" + "t" * 40))
    assert_problem(resp, 401)  # not a token when none is set: an unknown credential
