"""A function's canary release through the API, on the engine's own measurements of a real
worker (a simulated cluster forwarding to a local server that can fail or slow one version):
rolled back at its first step when it fails, promoted through every step when healthy, paused,
resumed, promoted or aborted now; every bad start refused with each violation named."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.api import assert_problem, create_fn
from tests.support.app import AppClient, ClientFactory
from tests.support.e2e import V, dep_url, eventually, until_status
from tests.support.e2e import status as status_of
from tests.support.invocation import deployed, invocation_app, pexec_url, sample, spec
from tests.support.upstream import UpstreamServer

PLAN: dict[str, Any] = {
    "steps": [{"weight": 50, "requests": 20}, {"weight": 80, "requests": 20}],
    "analysis": {"minRequests": 20, "maxErrorRateIncrease": 0.05, "maxLatencyRatio": 10},
}


@pytest.fixture
def upstream() -> Iterator[UpstreamServer]:
    server = UpstreamServer().start()
    yield server
    server.stop()


@pytest.fixture
async def client(
    client_factory: ClientFactory, tmp_path: Path, upstream: UpstreamServer
) -> AppClient:
    # the test drives the figures' reports and the release's rounds itself
    return await invocation_app(
        client_factory,
        tmp_path,
        upstream=upstream.url,
        invoke_route_cache_seconds=60,
        canary_interval=3600,
        jwt_secret=None,
    )


def canary_url(fn: dict[str, Any], action: str = "") -> str:
    return f"{V}/functions/{fn['id']}/canary" + (f"/{action}" if action else "")


async def new_version(client: AppClient, fn: dict[str, Any], *, deploy: bool) -> dict[str, Any]:
    resp = await client.post(
        f"{V}/functions/{fn['id']}/versions",
        json={
            "name": fn["name"],
            "inferenceUrl": "/echo",
            "inferencePort": 8000,
            "containerImage": "nvcr.io/acme/echo:2.0",
        },
    )
    assert resp.status_code == 200, resp.text
    version = dict(resp.json()["function"])
    if deploy:
        resp = await client.post(dep_url(version), json={"deploymentSpecifications": [spec()]})
        assert resp.status_code == 200, resp.text
        await until_status(client, version, "ACTIVE")
    return version


async def two_versions(client: AppClient) -> tuple[dict[str, Any], dict[str, Any]]:
    """A stable version serving alone (split 100) and a canary deployed next to it."""
    stable = await deployed(client)
    resp = await client.put(
        f"{V}/functions/{stable['id']}/traffic",
        json={"traffic": [{"versionId": stable["versionId"], "weight": 100}]},
    )
    assert resp.status_code == 200, resp.text
    return stable, await new_version(client, stable, deploy=True)


async def start(
    client: AppClient, stable: dict[str, Any], canary: dict[str, Any], plan: Any = PLAN
) -> Any:
    resp = await client.post(
        canary_url(stable), json={"versionId": canary["versionId"], "plan": plan}
    )
    assert resp.status_code == 200, resp.text
    # this replica learns which versions to measure
    await client.app.state.invocation.figures.publish()
    return resp.json()


async def invoke(client: AppClient, fn: dict[str, Any], canary: dict[str, Any], n: int) -> int:
    """Versionless invocations until `n` landed on the canary; how many did in all."""
    landed = total = 0
    while landed < n:
        resp = await client.post(pexec_url(fn, version=False), json={})
        assert resp.status_code in (200, 500), resp.text
        total += 1
        landed += resp.headers.get("NVCF-FUNCTION-VERSION-ID") == canary["versionId"] or (
            resp.json().get("headers", {}).get("NVCF-FUNCTION-VERSION-ID") == canary["versionId"]
        )
    return total


async def round_(client: AppClient) -> Any:
    """The replica's report, then one reading of the releases; the release as shown."""
    await client.app.state.invocation.figures.publish()
    await client.app.state.canary.round()
    return None


async def status(client: AppClient, fn: dict[str, Any]) -> dict[str, Any]:
    resp = await client.get(canary_url(fn))
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


async def events_of(client: AppClient, fn: dict[str, Any]) -> list[dict[str, Any]]:
    resp = await client.get(f"{V}/deployments/functions/{fn['id']}/versions/{fn['versionId']}")
    assert resp.status_code == 200, resp.text
    deployment_id = resp.json()["deployment"]["deploymentId"]
    resp = await client.get(f"{V}/deployments/{deployment_id}/events")
    assert resp.status_code == 200, resp.text
    return [e for e in resp.json()["events"] if e["kind"] == "canary"]


async def test_a_canary_failing_a_fifth_of_its_requests_is_rolled_back_at_its_first_step(
    client: AppClient, upstream: UpstreamServer
) -> None:
    stable, canary = await two_versions(client)
    upstream.fail_every[canary["versionId"]] = 5
    started = await start(client, stable, canary)
    assert (started["phase"], started["step"], started["weight"]) == ("RUNNING", 1, 50)
    await invoke(client, stable, canary, 20)
    await round_(client)
    shown = await status(client, stable)
    assert (shown["phase"], shown["step"], shown["weight"]) == ("ROLLED_BACK", 1, 0)
    assert "step 1 failed its analysis: error rate 20.00%" in shown["reason"]
    assert shown["analysis"]["canary"]["errorRate"] == pytest.approx(0.2, abs=0.05)
    assert shown["analysis"]["stable"]["errors"] == 0
    # the event says why, on the canary's timeline; the stable version takes all the traffic
    (event,) = [e for e in await events_of(client, canary) if e["reason"] == "CanaryRolledBack"]
    assert "error rate 20.00%" in event["message"]
    split = (await client.get(f"{V}/functions/{stable['id']}/traffic")).json()["traffic"]
    assert split == [{"versionId": stable["versionId"], "weight": 100}]
    for _ in range(20):
        resp = await client.post(pexec_url(stable, version=False), json={})
        assert resp.json()["headers"]["NVCF-FUNCTION-VERSION-ID"] == stable["versionId"]


async def test_a_healthy_canary_is_promoted_through_every_step(
    client: AppClient, upstream: UpstreamServer
) -> None:
    stable, canary = await two_versions(client)
    await start(client, stable, canary)
    await invoke(client, stable, canary, 20)
    await round_(client)
    shown = await status(client, stable)
    assert (shown["phase"], shown["step"], shown["weight"]) == ("RUNNING", 2, 80)
    assert shown["analysis"]["canary"]["requests"] == 0  # the new step's window
    # on /metrics: each version's requests with its role and weight, and the weights as of
    # the replica's last report
    await client.app.state.invocation.figures.publish()
    text = (await client.get("/metrics")).text
    at_50 = {"version_id": canary["versionId"], "role": "canary", "weight": "50"}
    assert sample(text, "nvcf_canary_requests_total", **at_50) >= 20
    assert sample(text, "nvcf_canary_duration_seconds_count", **at_50) >= 20
    assert sample(text, "nvcf_canary_weight", version_id=stable["versionId"], role="stable") == 20
    await invoke(client, stable, canary, 20)
    await round_(client)
    shown = await status(client, stable)
    assert (shown["phase"], shown["weight"]) == ("PROMOTED", 100)
    reasons = [e["reason"] for e in await events_of(client, canary)]
    assert reasons == ["CanaryStarted", "CanaryAdvanced", "CanaryPromoted"]
    split = (await client.get(f"{V}/functions/{stable['id']}/traffic")).json()["traffic"]
    assert split == [{"versionId": canary["versionId"], "weight": 100}]


async def test_a_canary_slower_than_the_latency_threshold_is_rolled_back(
    client: AppClient, upstream: UpstreamServer
) -> None:
    stable, canary = await two_versions(client)
    upstream.delay[canary["versionId"]] = 0.5
    plan = {
        "steps": [{"weight": 50, "requests": 10}, {"weight": 80, "requests": 10}],
        "analysis": {"minRequests": 10, "maxLatencyRatio": 2},
    }
    await start(client, stable, canary, plan)
    await invoke(client, stable, canary, 10)
    await round_(client)
    shown = await status(client, stable)
    assert shown["phase"] == "ROLLED_BACK", shown["reason"]
    assert "step 1 failed its analysis: p95 latency" in shown["reason"]
    figures = shown["analysis"]
    assert figures["canary"]["p95Seconds"] > 2 * figures["stable"]["p95Seconds"]


async def test_pause_holds_the_step_resume_goes_on_and_abort_rolls_back_now(
    client: AppClient,
) -> None:
    stable, canary = await two_versions(client)
    await start(client, stable, canary)
    resp = await client.post(canary_url(stable, "pause"), json={})
    assert resp.status_code == 200, resp.text
    assert (resp.json()["phase"], resp.json()["weight"]) == ("PAUSED", 50)
    await invoke(client, stable, canary, 20)
    await round_(client)
    assert (await status(client, stable))["phase"] == "PAUSED"
    problem = assert_problem(await client.post(canary_url(stable, "pause"), json={}), 400)
    assert "is PAUSED; only a RUNNING release can be paused" in str(problem["errors"])
    resp = await client.post(canary_url(stable, "resume"), json={})
    assert resp.json()["phase"] == "RUNNING"
    reasons = [e["reason"] for e in await events_of(client, canary)]
    assert reasons == ["CanaryStarted", "CanaryPaused", "CanaryResumed"]
    await round_(client)  # what the paused step measured still counts
    assert (await status(client, stable))["step"] == 2
    resp = await client.post(canary_url(stable, "abort"), json={})
    assert resp.status_code == 200, resp.text
    assert (resp.json()["phase"], resp.json()["weight"]) == ("ABORTED", 0)
    split = (await client.get(f"{V}/functions/{stable['id']}/traffic")).json()["traffic"]
    assert split == [{"versionId": stable["versionId"], "weight": 100}]
    # over: another release may start
    await start(client, stable, canary)


async def test_promote_now_gives_the_canary_all_the_traffic(client: AppClient) -> None:
    stable, canary = await two_versions(client)
    await start(client, stable, canary)
    resp = await client.post(canary_url(stable, "promote"), json={})
    assert (resp.json()["phase"], resp.json()["weight"]) == ("PROMOTED", 100)
    for _ in range(10):
        resp = await client.post(pexec_url(stable, version=False), json={})
        assert resp.json()["headers"]["NVCF-FUNCTION-VERSION-ID"] == canary["versionId"]


async def test_a_rollback_undeploys_the_canary_when_asked(
    client: AppClient, upstream: UpstreamServer
) -> None:
    stable, canary = await two_versions(client)
    upstream.fail_every[canary["versionId"]] = 2
    resp = await client.post(
        canary_url(stable),
        json={"versionId": canary["versionId"], "plan": PLAN, "undeployOnRollback": True},
    )
    assert resp.status_code == 200, resp.text
    await client.app.state.invocation.figures.publish()
    await invoke(client, stable, canary, 20)
    await round_(client)
    assert (await status(client, stable))["phase"] == "ROLLED_BACK"
    await until_status(client, canary, "INACTIVE")


async def running(client: AppClient, fn: dict[str, Any]) -> int:
    resp = await client.get(dep_url(fn))
    assert resp.status_code == 200, resp.text
    instances = resp.json()["deployment"].get("instances") or []
    return sum(1 for i in instances if i.get("phase") == "Running")


async def test_each_versions_instances_follow_its_share_of_the_traffic(
    client_factory: ClientFactory, tmp_path: Path, upstream: UpstreamServer
) -> None:
    # room for the instances that drain (for the route-cache period) while others start
    client = await invocation_app(
        client_factory,
        tmp_path,
        upstream=upstream.url,
        gpus=16,
        invoke_route_cache_seconds=60,
        canary_interval=3600,
        jwt_secret=None,
    )
    four = [spec(minInstances=4, maxInstances=4)]
    stable = await deployed(client, specs=four)
    resp = await client.put(
        f"{V}/functions/{stable['id']}/traffic",
        json={"traffic": [{"versionId": stable["versionId"], "weight": 100}]},
    )
    assert resp.status_code == 200, resp.text
    canary = await new_version(client, stable, deploy=False)
    resp = await client.post(dep_url(canary), json={"deploymentSpecifications": four})
    assert resp.status_code == 200, resp.text
    await until_status(client, canary, "ACTIVE")
    plan = {"steps": [{"weight": 25, "seconds": 3600}]}
    resp = await client.post(
        canary_url(stable), json={"versionId": canary["versionId"], "plan": plan}
    )
    assert resp.status_code == 200, resp.text

    async def counts(wanted: tuple[int, int]) -> bool:
        return (await running(client, stable), await running(client, canary)) == wanted

    # at 25 %: a quarter of minInstances 4 for the canary, three quarters for the stable one
    await eventually(lambda: counts((3, 1)))
    events = (
        await client.get(f"{V}/deployments/{stable['deployment']['deploymentId']}/events")
    ).json()
    shares = [e["message"] for e in events["events"] if e.get("reason") == "TrafficShare"]
    assert any("75%" in m for m in shares)
    assert (await client.post(canary_url(stable, "promote"), json={})).status_code == 200
    await eventually(lambda: counts((1, 4)))
    for fn in (stable, canary):
        assert await status_of(client, fn) == "ACTIVE"


async def test_bad_starts_are_refused_naming_every_violation(client: AppClient) -> None:
    stable, canary = await two_versions(client)
    other = await create_fn(client, name="other")
    undeployed = await new_version(client, stable, deploy=False)
    cases: list[tuple[dict[str, Any], list[str]]] = [
        ({"versionId": canary["versionId"], "plan": {"steps": []}}, ["plan.steps"]),
        (
            {
                "versionId": canary["versionId"],
                "plan": {
                    "steps": [{"weight": 10, "requests": 5}],
                    "analysis": {"maxErrorRateIncrease": 2, "maxLatencyRatio": 0.5},
                },
            },
            ["plan.analysis.maxErrorRateIncrease", "plan.analysis.maxLatencyRatio"],
        ),
        ({"versionId": other["versionId"], "plan": PLAN}, ["versionId"]),
        ({"versionId": undeployed["versionId"], "plan": PLAN}, ["versionId"]),
        (
            {"versionId": canary["versionId"], "stableVersionId": other["versionId"], "plan": PLAN},
            ["stableVersionId"],
        ),
        ({"plan": {"steps": [{"weight": 0}]}}, ["versionId", "plan.steps[0].weight"]),
    ]
    for body, fields in cases:
        problem = assert_problem(await client.post(canary_url(stable), json=body), 400)
        named = [e["field"] for e in problem["errors"]]
        for field in fields:
            assert any(n.startswith(field) for n in named), (body, problem)
    assert assert_problem(await client.get(canary_url(stable)), 404)
    await start(client, stable, canary)
    again = {"versionId": canary["versionId"], "plan": PLAN}
    problem = assert_problem(await client.post(canary_url(stable), json=again), 400)
    assert "promote or abort it before starting another" in str(problem["errors"])
    # nothing changed: the first release runs at its first step
    assert (await status(client, stable))["step"] == 1
