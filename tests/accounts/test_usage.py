"""`GET /v2/nvcf/usage` (accounts/usage.py) over the app: 1,000 LLM calls metered as the
workers' `usage` says, as JSON and CSV, grouped by model and function; a tenant reads its own
account only; every bad parameter named in one 400."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest

from service.metering.counts import Meter
from tests.support.api import bearer, create_fn, new_key
from tests.support.app import AppClient, ClientFactory
from tests.support.e2e import dep_url
from tests.support.invocation import deployed, invocation_app, spec

V = "/v2/nvcf"
CHAT = f"{V}/llm/v1/chat/completions"
URIS = ["/v1/chat/completions", "/v1/responses", "/v1/embeddings"]
LLM_FN: dict[str, Any] = {
    "name": "tiny-llm",
    "inferenceUrl": "/",
    "functionType": "LLM",
    "models": [{"name": "tiny/chat", "llmConfig": {"uris": URIS}}],
}


@pytest.fixture
async def app(client_factory: ClientFactory, tmp_path: Path) -> AppClient:
    return await invocation_app(client_factory, tmp_path)


def meter(app: AppClient) -> Meter:
    found = app.app.state.invocation.engine.metrics.meter
    assert isinstance(found, Meter)
    return found


def stream_usage(text: str) -> dict[str, Any]:
    """The `usage` of a streamed chat completion (the chunk that carries it)."""
    chunks = [
        json.loads(line[len("data: ") :])
        for line in text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]
    [usage] = [c["usage"] for c in chunks if c.get("usage")]
    return dict(usage)


async def test_a_thousand_llm_calls_are_metered_as_the_workers_usage_says(app: AppClient) -> None:
    fn = await deployed(app, **LLM_FN)
    model = f"{fn['id']}/tiny/chat"
    given = taken = 0
    for n in range(1000):
        words = " ".join(["word"] * (1 + n % 7))
        body: dict[str, Any] = {
            "model": model,
            "messages": [{"role": "user", "content": words}],
            "max_tokens": 1 + n % 5,
        }
        streamed = n % 20 == 0  # one in twenty streamed: the usage comes in its last chunk
        if streamed:
            body.update(stream=True, stream_options={"include_usage": True})
        resp = await app.post(CHAT, json=body)
        assert resp.status_code == 200, resp.text
        used = stream_usage(resp.text) if streamed else resp.json()["usage"]
        given += used["prompt_tokens"]
        taken += used["completion_tokens"]
    await meter(app).flush()

    by_model = (await app.get(f"{V}/usage", params={"by": "model"})).json()
    # GPU time is no model's: it stands in its own row
    [row] = [r for r in by_model["usage"] if r["model"] is not None]
    assert row["model"] == "tiny/chat"
    assert (row["invocations"], row["inputTokens"], row["outputTokens"]) == (1000, given, taken)
    assert by_model["total"]["inputTokens"] == given

    by_function = (await app.get(f"{V}/usage", params={"by": "function"})).json()["usage"]
    counted = [r for r in by_function if r["functionId"] == fn["id"]]
    assert [(r["invocations"], r["outputTokens"]) for r in counted] == [(1000, taken)]
    assert counted[0]["gpuSeconds"] > 0  # its instance has been Running all along

    # the same as CSV, by header or by parameter
    for kwargs in ({"headers": {"accept": "text/csv"}}, {"params": {"format": "csv"}}):
        params = {"by": "model", **kwargs.get("params", {})}
        resp = await app.get(f"{V}/usage", params=params, headers=kwargs.get("headers"))
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/csv")
        [line] = [r for r in csv.DictReader(io.StringIO(resp.text)) if r["model"]]
        assert (line["model"], line["inputTokens"], line["outputTokens"]) == (
            "tiny/chat",
            str(given),
            str(taken),
        )

    # flushed again with nothing new: nothing changes
    await meter(app).flush()
    again = (await app.get(f"{V}/usage", params={"by": "model"})).json()["usage"]
    assert [r for r in again if r["model"] is not None] == [row]


async def test_a_tenant_reads_its_own_account_and_the_operator_any(app: AppClient) -> None:
    await app.post(f"{V}/accounts/team-a", json={})
    tenant = await new_key(app, ["list_functions"], account="team-a")
    own = await app.get(f"{V}/usage", headers=bearer(tenant))
    assert own.status_code == 200, own.text
    assert own.json()["account"] == "team-a" and own.json()["usage"] == []
    other = await app.get(f"{V}/usage", params={"account": "nvcf-default"}, headers=bearer(tenant))
    assert other.status_code == 403 and "account_setup" in other.json()["detail"]
    operator = await app.get(f"{V}/usage", params={"account": "team-a"})
    assert operator.status_code == 200 and operator.json()["account"] == "team-a"
    nothing = await new_key(app, ["invoke_function"], account="team-a")
    assert (await app.get(f"{V}/usage", headers=bearer(nothing))).status_code == 403


async def test_every_bad_parameter_is_named_in_one_400(app: AppClient) -> None:
    resp = await app.get(
        f"{V}/usage",
        params={
            "since": "yesterday",
            "by": "colour",
            "account": "nobody",
            "format": "xml",
            "step": "minute",
        },
    )
    assert resp.status_code == 400, resp.text
    fields = {e["field"]: e["message"] for e in resp.json()["errors"]}
    assert set(fields) == {"since", "by", "account", "format", "step"}
    assert "unknown account 'nobody'" in fields["account"]
    assert "function, version, model, instanceType, cluster" in fields["by"]

    backwards = await app.get(
        f"{V}/usage", params={"since": "2026-02-01T00:00:00Z", "until": "2026-01-01T00:00:00Z"}
    )
    assert backwards.status_code == 400
    assert backwards.json()["errors"] == [{"field": "since", "message": "must be before until"}]
    too_long = await app.get(
        f"{V}/usage", params={"since": "2024-01-01T00:00:00Z", "until": "2026-01-01T00:00:00Z"}
    )
    assert too_long.status_code == 400 and too_long.json()["errors"][0]["field"] == "until"
    assert (await app.get(f"{V}/usage", params={"account": "x" * 129})).status_code == 400
    hourly = {"since": "2025-01-01T00:00:00Z", "until": "2026-01-01T00:00:00Z", "step": "hour"}
    too_many = await app.get(f"{V}/usage", params=hourly)
    assert too_many.status_code == 400 and too_many.json()["errors"][0]["field"] == "step"


async def test_a_series_gives_each_steps_totals(app: AppClient) -> None:
    params = {"since": "2026-01-01T00:00:00Z", "until": "2026-01-08T00:00:00Z", "step": "day"}
    body = (await app.get(f"{V}/usage", params=params)).json()
    assert [p["since"] for p in body["series"]][:2] == [
        "2026-01-01T00:00:00.000Z",
        "2026-01-02T00:00:00.000Z",
    ]
    assert len(body["series"]) == 7
    assert all(p["gpuSeconds"] == 0 and p["invocations"] == 0 for p in body["series"])


async def test_nvcfs_gpu_usage_sums_the_deployed_functions_instances(app: AppClient) -> None:
    for name, low, high in (("one", 1, 2), ("two", 0, 3)):
        fn = await create_fn(app, name=name)
        body = {"deploymentSpecifications": [spec(minInstances=low, maxInstances=high)]}
        resp = await app.post(dep_url(fn), json=body)
        assert resp.status_code == 200, resp.text
    resp = await app.get(f"{V}/accounts/nvcf-default/usage/gpus")
    assert resp.status_code == 200, resp.text
    [gpu] = resp.json()["gpus"]
    assert (gpu["gpu"], gpu["currentMaxUsage"], gpu["currentMinUsage"]) == ("H100", 5, 1)
    assert [(p["currentMaxUsage"], p["currentMinUsage"]) for p in gpu["placements"]] == [(5, 1)]
    assert set(gpu["placements"][0]) >= {"clusterId", "clusterGroup", "cloudProvider", "region"}

    await app.post(f"{V}/accounts/team-g", json={})
    tenant = await new_key(app, ["deploy_function"], account="team-g")
    own = await app.get(f"{V}/accounts/team-g/usage/gpus", headers=bearer(tenant))
    assert own.status_code == 200 and own.json() == {"gpus": []}
    other = await app.get(f"{V}/accounts/nvcf-default/usage/gpus", headers=bearer(tenant))
    assert other.status_code == 403
    unknown = await app.get(f"{V}/accounts/nobody/usage/gpus")
    assert unknown.status_code == 400 and "unknown account 'nobody'" in unknown.text
