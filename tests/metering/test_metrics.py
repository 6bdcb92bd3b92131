"""The metered totals on /metrics (metering/metrics.py): the stored totals, the same the usage
route reads, served to an operator's scrape only."""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy.ext.asyncio import AsyncSession

from service.core.db import utcnow
from service.metering.counts import Meter
from service.metering.metrics import UsageCounters
from service.metering.models import GpuInterval
from tests.support.app import AppClient, ClientFactory
from tests.support.invocation import deployed, invocation_app, sample
from tests.support.reconcile import Harness

LLM_FN: dict[str, Any] = {
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


async def test_the_gpu_totals_sum_ended_intervals_in_the_database_and_open_ones_up_to_now(
    harness: Harness,
) -> None:
    """Ended intervals are summed by the database (SQLite's and PostgreSQL's date arithmetic
    alike), open ones and ones ending after now up to now; nothing is counted twice."""
    now = utcnow()
    fid, tid = uuid.uuid4(), uuid.uuid4()

    def interval(**kw: Any) -> GpuInterval:
        base: dict[str, Any] = {
            "instance_id": uuid.uuid4(),
            "account_id": "acct",
            "function_id": fid,
            "gpu": "H100",
            "instance_type": "DGX.H100_2x",
            "cluster": "c1",
            "gpus": 2,
            "created_at": now - timedelta(hours=2),
        }
        return GpuInterval(**(base | kw))

    async with harness.maker() as session, session.begin():
        session.add_all(
            [
                # ready 90.5 s then ended: 181 GPU-seconds
                interval(
                    started_at=now - timedelta(seconds=100),
                    ended_at=now - timedelta(seconds=9.5),
                ),
                # never ready, 30 s from creation to end: 60 not-ready GPU-seconds
                interval(
                    created_at=now - timedelta(seconds=40), ended_at=now - timedelta(seconds=10)
                ),
                # ready 20 s ago and still on: about 40
                interval(started_at=now - timedelta(seconds=20)),
                # a task's, another key: ready 10 s, ending in the future: about 20
                interval(
                    function_id=None,
                    task_id=tid,
                    started_at=now - timedelta(seconds=10),
                    ended_at=now + timedelta(hours=1),
                ),
                # another account's, ended: 1 GPU for 5 s
                interval(
                    account_id="other",
                    gpus=1,
                    started_at=now - timedelta(seconds=15),
                    ended_at=now - timedelta(seconds=10),
                ),
            ]
        )

    async def no_tasks(session: AsyncSession) -> list[Any]:
        return []

    counters = UsageCounters(CollectorRegistry(), max_age=0)
    await counters.refresh(harness.maker, no_tasks)
    totals = {
        (m.name, s.labels["account"], s.labels["function_id"], s.labels["task_id"]): s.value
        for m in counters.collect()
        for s in m.samples
        if m.name.startswith("nvcf_gpu")
    }
    ready = totals["nvcf_gpu_seconds", "acct", str(fid), ""]
    assert 181 + 40 <= ready < 181 + 40 + 5
    assert totals["nvcf_gpu_not_ready_seconds", "acct", str(fid), ""] == pytest.approx(60)
    assert 20 <= totals["nvcf_gpu_seconds", "acct", "", str(tid)] < 25
    assert totals["nvcf_gpu_seconds", "other", str(fid), ""] == pytest.approx(5)
