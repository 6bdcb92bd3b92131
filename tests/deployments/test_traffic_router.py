"""A function's traffic split through the API: set and read, applied to the invocations that
name no version (an explicit version still wins), refused with every violation named."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from service.core.db import make_sessionmaker, utcnow
from service.core.errors import FieldError
from service.core.events import Events
from service.deployments import traffic, transitions
from service.deployments.models import Deployment
from service.deployments.reconcile.store import ReconcileStore
from service.functions import service as functions
from tests.support.api import CONTAINER_FN, assert_problem, bearer, create_fn
from tests.support.app import AppClient, ClientFactory
from tests.support.e2e import V, dep_url, until_status
from tests.support.invocation import deployed, invocation_app, pexec_url, spec
from tests.support.races import writers
from tests.support.reconcile import (
    ACCOUNT,
    Harness,
    add_version,
    workload,
)


@pytest.fixture
async def client(client_factory: ClientFactory, tmp_path: Path) -> AppClient:
    return await invocation_app(
        client_factory, tmp_path, invoke_route_cache_seconds=60, jwt_secret=None
    )


def traffic_url(fn: dict[str, Any]) -> str:
    return f"{V}/functions/{fn['id']}/traffic"


async def second_version(client: AppClient, fn: dict[str, Any], *, deploy: bool) -> dict[str, Any]:
    resp = await client.post(f"{V}/functions/{fn['id']}/versions", json=CONTAINER_FN)
    assert resp.status_code == 200, resp.text
    version = dict(resp.json()["function"])
    if deploy:
        resp = await client.post(dep_url(version), json={"deploymentSpecifications": [spec()]})
        assert resp.status_code == 200, resp.text
        await until_status(client, version, "ACTIVE")
    return version


async def landed(client: AppClient, fn: dict[str, Any], *, version: bool = False) -> str:
    resp = await client.post(pexec_url(fn, version=version), json={})
    assert resp.status_code == 200, resp.text
    return str(resp.json()["headers"]["NVCF-FUNCTION-VERSION-ID"])


async def test_a_split_sends_the_versionless_invocations_and_an_explicit_version_wins(
    client: AppClient,
) -> None:
    stable = await deployed(client)
    canary = await second_version(client, stable, deploy=True)
    # without a split, the newest invocable version takes them all
    assert (await client.get(traffic_url(stable))).json() == {
        "functionId": stable["id"],
        "traffic": [],
    }
    assert await landed(client, stable) == canary["versionId"]
    split = [
        {"versionId": stable["versionId"], "weight": 100},
        {"versionId": canary["versionId"], "weight": 0},
    ]
    resp = await client.put(traffic_url(stable), json={"traffic": split})
    assert resp.status_code == 200, resp.text
    assert resp.json() == (await client.get(traffic_url(stable))).json()
    assert resp.json()["traffic"] == split
    assert {await landed(client, stable) for _ in range(20)} == {stable["versionId"]}
    assert await landed(client, canary, version=True) == canary["versionId"]
    # an empty split: today's rule again
    resp = await client.put(traffic_url(stable), json={"traffic": []})
    assert resp.status_code == 200, resp.text
    assert await landed(client, stable) == canary["versionId"]


async def test_a_bad_split_is_refused_naming_each_violation_and_changes_nothing(
    client: AppClient,
) -> None:
    fn = await deployed(client)
    idle = await second_version(client, fn, deploy=False)
    other = await create_fn(client)
    split = [
        {"versionId": fn["versionId"], "weight": 50},
        {"versionId": idle["versionId"], "weight": 20},
        {"versionId": other["versionId"], "weight": 20},
        {"versionId": fn["versionId"], "weight": 5},
        {"versionId": "nope", "weight": 101},
    ]
    problem = assert_problem(await client.put(traffic_url(fn), json={"traffic": split}), 400)
    fields = [e["field"] for e in problem["errors"]]
    assert fields == ["traffic[4].versionId", "traffic[4].weight"], problem
    problem = assert_problem(await client.put(traffic_url(fn), json={"traffic": split[:4]}), 400)
    messages = {e["field"]: e["message"] for e in problem["errors"]}
    assert "INACTIVE" in messages["traffic[1].versionId"]
    assert f"not a version of function {fn['id']}" in messages["traffic[2].versionId"]
    assert "more than once" in messages["traffic[3].versionId"]
    assert "sum to 100, got 95" in messages["traffic"]
    assert (await client.get(traffic_url(fn))).json()["traffic"] == []
    assert_problem(await client.put(traffic_url(other), json={}), 400)


async def test_a_token_sees_the_split_of_the_versions_it_may_invoke(client: AppClient) -> None:
    old = await deployed(client)
    new = await second_version(client, old, deploy=True)
    split = [
        {"versionId": old["versionId"], "weight": 30},
        {"versionId": new["versionId"], "weight": 70},
    ]
    assert (await client.put(traffic_url(old), json={"traffic": split})).status_code == 200
    resp = await client.post(
        f"{V}/tokens/functions/{old['id']}/versions/{old['versionId']}", json={"clientId": "c"}
    )
    assert resp.status_code == 200, resp.text
    token = bearer(resp.json()["access_token"])
    for _ in range(10):
        resp = await client.post(pexec_url(old, version=False), json={}, headers=token)
        assert resp.status_code == 200, resp.text
        assert resp.json()["headers"]["NVCF-FUNCTION-VERSION-ID"] == old["versionId"]
    # the owner's view holds both: both take some of 40 requests
    assert {await landed(client, old) for _ in range(40)} == {old["versionId"], new["versionId"]}


async def test_two_splits_set_at_once_both_answer_and_the_last_one_stands(
    database_url: str,
) -> None:
    async with writers(database_url) as w:
        maker = make_sessionmaker(w.engine)
        async with maker() as session, session.begin():
            fid, vid = await add_version(session)
        async with maker() as first:
            await transitions.set_split(first, fid, {vid: 100}, utcnow())

            async def second() -> None:
                async with maker() as session, session.begin():
                    await transitions.set_split(session, fid, {vid: 100}, utcnow())

            setting = asyncio.create_task(second())
            await w.until_waiting()
            await first.commit()
        await setting
        async with maker() as session:
            split = await traffic.split_of(session, fid)
        assert [(t.version_id, t.weight) for t in split.traffic] == [(vid, 100)]


async def test_a_split_set_as_the_autoscaler_commits_a_target_scales_that_target(
    database_url: str,
) -> None:
    async with writers(database_url) as w:
        maker = make_sessionmaker(w.engine)
        h = Harness.on(maker)
        dep = await h.deploy([workload()], min_instances=1)
        async with maker() as session, session.begin():
            (spec,) = (await session.get_one(Deployment, dep.id)).specs
            spec.max_instances = 8
        async with maker() as scaling:
            # the autoscaler holds the deployment and sets its target to 4
            (held,) = await ReconcileStore(maker, "test", 30).lock_deployments(
                scaling, [dep.id], skip_locked=False
            )
            now = utcnow()
            transitions.set_targets(scaling, held, {spec.id: 4}, now, reason="r", message="m")
            await scaling.flush()

            async def split() -> None:
                async with maker() as session, session.begin():
                    await transitions.set_split(session, dep.function_id, {dep.version_id: 50}, now)

            setting = asyncio.create_task(split())
            await w.until_waiting()
            await scaling.commit()
        await setting
        async with maker() as session:
            (spec,) = (await session.get_one(Deployment, dep.id)).specs
        # half the traffic: half the autoscaler's 4
        assert (spec.traffic_share, spec.target_instances, spec.desired_instances) == (50, 2, 2)


async def test_a_split_naming_a_version_as_its_delete_commits_is_refused(
    database_url: str,
) -> None:
    async with writers(database_url) as w:
        maker = make_sessionmaker(w.engine)
        h = Harness.on(maker)
        dep = await h.deploy([workload()], status="ACTIVE")
        fid, vid = dep.function_id, dep.version_id
        async with maker() as deleting:
            await functions.delete_version(deleting, ACCOUNT, fid, vid, events=Events())

            async def split() -> list[FieldError]:
                # what PUT /functions/{id}/traffic does once the body is parsed
                async with maker() as session, session.begin():
                    entry = traffic.TrafficWeightIn.model_construct(version_id=vid, weight=100)
                    errors = await traffic.violations(session, fid, [entry])
                    if not errors:
                        await transitions.set_split(session, fid, {vid: 100}, utcnow())
                    return errors

            setting = asyncio.create_task(split())
            await w.until_waiting()
            await deleting.commit()
        assert [e.field for e in await setting] == ["traffic[0].versionId"]
