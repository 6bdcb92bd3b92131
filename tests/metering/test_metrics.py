"""The metered totals on /metrics (metering/metrics.py): the stored totals, the same the usage
route reads, served to an operator's scrape only."""

from __future__ import annotations

from pathlib import Path

from service.metering.counts import Meter
from tests.support.app import AppClient, ClientFactory
from tests.support.invocation import deployed, invocation_app, sample

LLM_FN = {
    "name": "tiny-llm",
    "inferenceUrl": "/",
    "functionType": "LLM",
    "models": [{"name": "tiny/chat", "llmConfig": {"uris": ["/v1/chat/completions"]}}],
}


async def test_the_totals_match_the_usage_route_for_operators_only(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    app: AppClient = await invocation_app(
        client_factory, tmp_path, metrics_fleet_cache_seconds=0.001
    )
    fn = await deployed(app, **LLM_FN)
    for n in range(10):
        resp = await app.post(
            "/v2/nvcf/llm/v1/chat/completions",
            json={
                "model": f"{fn['id']}/tiny/chat",
                "messages": [{"role": "user", "content": "hi " * (n + 1)}],
            },
        )
        assert resp.status_code == 200, resp.text
    meter = app.app.state.invocation.engine.metrics.meter
    assert isinstance(meter, Meter)
    await meter.flush()
    [row] = [
        r
        for r in (await app.get("/v2/nvcf/usage", params={"by": "model"})).json()["usage"]
        if r["model"] == "tiny/chat"
    ]
    text = (await app.get("/metrics")).text  # the admin key: an operator's scrape
    labels = {"function_id": fn["id"], "model": "tiny/chat"}
    assert sample(text, "nvcf_usage_invocations_total", **labels) == 10
    assert (
        sample(text, "nvcf_usage_tokens_total", token_type="input", **labels) == row["inputTokens"]
    )
    assert (
        sample(text, "nvcf_usage_tokens_total", token_type="output", **labels)
        == row["outputTokens"]
    )
    assert sample(text, "nvcf_gpu_seconds_total", function_id=fn["id"]) > 0

    anonymous = await app.get("/metrics", headers={"authorization": ""})
    assert anonymous.status_code == 200
    assert "nvcf_gpu_seconds_total" not in anonymous.text
    assert "nvcf_usage_tokens_total" not in anonymous.text
