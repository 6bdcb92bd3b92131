"""Live configuration updates of a helm function through the HTTP API on the simulated clusters:
a configuration PATCH makes revision 2 and rolls the instance to it while requests keep being
answered; a bad configuration is refused with its rule ids and changes nothing; a configuration
whose new instance fails leaves the serving revision; a rollback rolls back the same way."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.support.app import AppClient, ClientFactory
from tests.support.charts import PushCorpus
from tests.support.e2e import V, deployment, eventually, until_status
from tests.support.helm_e2e import deploy, events, pod_faults, setup, spec
from tests.support.invocation import pexec_url
from tests.support.registry import RegistryServer

pytestmark = pytest.mark.registry


def spec_url(dep: dict[str, Any]) -> str:
    sid = dep["deploymentSpecifications"][0]["gpuSpecificationId"]
    return f"{V}/deployments/{dep['deploymentId']}/gpu-specifications/{sid}"


async def settled_on(client: AppClient, fn: dict[str, Any], revision: int) -> dict[str, Any]:
    """The deployment once its one instance runs `revision` and nothing else is wanted."""

    async def check() -> dict[str, Any] | None:
        dep = await deployment(client, fn)
        gs = dep["deploymentSpecifications"][0]
        instances = dep["instances"]
        if (
            gs["revision"] == revision
            and gs["targetRevision"] == revision
            and [(i["revision"], i["phase"]) for i in instances] == [(revision, "Running")]
        ):
            return dep
        return None

    try:
        result: dict[str, Any] = await eventually(check)
    except AssertionError:
        dep = await deployment(client, fn)
        for e in await events(client, dep):
            print(e["at"], e["kind"], e.get("reason"), e["message"][:160])
        print(dep)
        raise
    return result


async def test_configuration_patch_rolls_to_revision_2_without_a_failed_request(
    client_factory: ClientFactory,
    tmp_path: Path,
    anon_registry: RegistryServer,
    push_corpus: PushCorpus,
) -> None:
    client, [fn] = await setup(
        client_factory, tmp_path, anon_registry, push_corpus, invoke_route_cache_seconds=0.2
    )
    dep = await deploy(client, fn, spec({"image": {"tag": "1.0"}}))
    await until_status(client, fn, "ACTIVE")
    dep = await settled_on(client, fn, 1)
    [old] = dep["instances"]

    # a configuration breaking a restriction: 400 with the rule id, nothing changes
    bad = await client.patch(
        spec_url(dep), json={"configuration": {"service": {"type": "NodePort"}}}
    )
    assert bad.status_code == 400, bad.text
    assert [(e["field"], e["rule"]) for e in bad.json()["errors"]] == [
        ("configuration", "service-type")
    ]
    revisions = (await client.get(spec_url(dep) + "/revisions")).json()["revisions"]
    assert [r["revision"] for r in revisions] == [1]
    assert (await deployment(client, fn))["deploymentSpecifications"][0]["targetRevision"] == 1

    # requests keep coming during the rollout; none may fail
    answers: list[tuple[int, str | None]] = []
    stop = asyncio.Event()

    async def invoke_continuously() -> None:
        while not stop.is_set():
            resp = await client.post(
                pexec_url(fn), json={"n": len(answers)}, headers={"X-Sim-Delay-Ms": "30"}
            )
            body = resp.json() if resp.status_code == 200 else {}
            answers.append((resp.status_code, body.get("instanceId")))

    invoker = asyncio.create_task(invoke_continuously())
    await eventually(lambda: _truthy(len(answers) >= 3))
    resp = await client.patch(spec_url(dep), json={"configuration": {"image": {"tag": "2.0"}}})
    assert resp.status_code == 200, resp.text
    gs = resp.json()["gpuSpecification"]
    assert (gs["revision"], gs["targetRevision"], gs["rollout"]["state"]) == (1, 2, "progressing")
    assert gs["configuration"] == {"image": {"tag": "2.0"}}

    dep = await settled_on(client, fn, 2)
    [new] = dep["instances"]
    await eventually(lambda: _truthy(any(i == new["instanceId"] for _, i in answers)))
    stop.set()
    await invoker
    assert answers and all(code == 200 for code, _ in answers), answers
    served = {i for _, i in answers}
    assert served == {old["instanceId"], new["instanceId"]}
    rollout = dep["deploymentSpecifications"][0]["rollout"]
    assert (rollout["state"], rollout["updatedInstances"], rollout["desiredInstances"]) == (
        "completed",
        1,
        1,
    )
    revisions = (await client.get(spec_url(dep) + "/revisions")).json()["revisions"]
    assert [(r["revision"], r["current"], r["target"]) for r in revisions] == [
        (1, False, False),
        (2, True, True),
    ]
    assert revisions[1]["configuration"] == {"image": {"tag": "2.0"}}
    assert revisions[1]["createdBy"].startswith("api-key:")
    reasons = [e["reason"] for e in await events(client, dep) if e["kind"] == "rollout"]
    assert reasons[0] == "RolloutStarted" and reasons[-1] == "RolloutCompleted"
    assert "Replaced" in reasons

    # a configuration whose new instance fails: the rollout stops, revision 2 keeps serving
    resp = await client.patch(spec_url(dep), json={"configuration": pod_faults("ImagePullBackOff")})
    assert resp.status_code == 200, resp.text

    async def failed() -> dict[str, Any] | None:
        d = await deployment(client, fn)
        r = d["deploymentSpecifications"][0].get("rollout") or {}
        return d if r.get("state") == "failed" else None

    try:
        dep = await eventually(failed)
    except AssertionError:
        for e in await events(client, dep):
            print(e["kind"], e.get("reason"), e["message"][:200])
        print(await deployment(client, fn))
        raise
    gs = dep["deploymentSpecifications"][0]
    assert (gs["revision"], gs["targetRevision"]) == (2, 2)
    assert "revision 3" in gs["rollout"]["reason"] and "ImagePull" in gs["rollout"]["reason"]
    assert gs["configuration"] == {"image": {"tag": "2.0"}}
    dep = await settled_on(client, fn, 2)
    assert dep["instances"][0]["instanceId"] == new["instanceId"]
    assert dep["functionStatus"] == "ACTIVE"
    ok = await client.post(pexec_url(fn), json={})
    assert ok.status_code == 200 and ok.json()["instanceId"] == new["instanceId"]

    # rollback to revision 1: rolled the same way
    resp = await client.post(spec_url(dep) + "/revisions/1/rollback")
    assert resp.status_code == 200, resp.text
    assert resp.json()["gpuSpecification"]["targetRevision"] == 1
    dep = await settled_on(client, fn, 1)
    gs = dep["deploymentSpecifications"][0]
    assert gs["configuration"] == {"image": {"tag": "1.0"}}
    assert gs["rollout"]["state"] == "completed"
    reasons = [e["reason"] for e in await events(client, dep) if e["kind"] == "rollout"]
    assert "RolloutFailed" in reasons and reasons[-1] == "RolloutCompleted"
    assert "RollbackStarted" in reasons

    # unknown and malformed revisions
    assert (await client.post(spec_url(dep) + "/revisions/9/rollback")).status_code == 404
    bad_number = await client.post(spec_url(dep) + "/revisions/x/rollback")
    assert bad_number.status_code == 400
    assert [e["field"] for e in bad_number.json()["errors"]] == ["revision"]


async def _truthy(value: bool) -> bool:
    return value
