"""The version read speed-ups (read_cache.py): cached reads, answered before FastAPI or by the
route, behave exactly like the database read, and say which path answered."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import jwt
import pytest
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.core.db import utcnow
from service.deployments.models import Deployment, Instance
from service.deployments.transitions.status import StatusChange, set_version_statuses
from service.functions.models import FunctionVersion
from service.health.status import VersionStatus
from tests.support.api import bearer, create_fn, new_key
from tests.support.app import JWT_SECRET, AppClient, ClientFactory
from tests.support.e2e import dep_url, until_status, write_catalog

V = "/v2/nvcf"


async def test_repeated_reads_are_identical_and_counted(client: AppClient) -> None:
    fn = await create_fn(client)
    path = f"{V}/functions/{fn['id']}/versions/{fn['versionId']}"
    first = await client.get(path)  # fills the cache through the route
    second = await client.get(path)  # served from it
    assert first.status_code == second.status_code == 200
    assert first.content == second.content
    assert second.headers["content-type"] == "application/json"
    assert second.headers["x-request-id"] != first.headers["x-request-id"]
    metrics = (await client.get("/metrics")).text
    line = (
        'nvcf_http_requests_total{method="GET",'
        'route="/v2/nvcf/functions/{functionId}/versions/{functionVersionId}",status="200"} 2.0'
    )
    assert line in metrics


async def test_every_refusal_still_applies_to_cached_versions(client: AppClient) -> None:
    fn = await create_fn(client)
    path = f"{V}/functions/{fn['id']}/versions/{fn['versionId']}"
    assert (await client.get(path)).status_code == 200
    assert (await client.get(path)).status_code == 200

    plain = bearer(await new_key(client, ["list_functions"]))  # caches the plain variant too
    assert (await client.get(path, headers=plain)).status_code == 200
    # Each refusal twice: the second request comes with a key the server has just verified.
    no_scope = bearer(await new_key(client, ["register_function"]))
    for _ in range(2):
        resp = await client.get(path, headers=no_scope)
        assert resp.status_code == 403 and "list_functions" in resp.json()["detail"]

    stranger = bearer(await new_key(client, ["list_functions"], account="stranger"))
    for _ in range(2):
        assert (await client.get(path, headers=stranger)).status_code == 404

    other_org = f"/v2/orgs/stranger/nvcf/functions/{fn['id']}/versions/{fn['versionId']}"
    assert (await client.get(other_org)).status_code == 403
    own_org = f"/v2/orgs/nvcf-default/nvcf/functions/{fn['id']}/versions/{fn['versionId']}"
    assert (await client.get(own_org)).content == (await client.get(path)).content

    assert (
        await client.get(path, headers={"Authorization": "Bearer nvapi-nope"})
    ).status_code == 401
    assert (await client.get(path, headers={"Authorization": ""})).status_code == 401


async def test_a_revoked_key_is_refused_on_the_next_cached_read(client: AppClient) -> None:
    fn = await create_fn(client)
    path = f"{V}/functions/{fn['id']}/versions/{fn['versionId']}"
    created = (await client.post(f"{V}/api-keys", json={"scopes": ["list_functions"]})).json()
    key = bearer(created["apiKey"]["key"])
    assert (await client.get(path, headers=key)).status_code == 200
    assert (await client.get(path, headers=key)).status_code == 200
    assert (await client.delete(f"{V}/api-keys/{created['apiKey']['id']}")).status_code == 204
    assert (await client.get(path, headers=key)).status_code == 401


async def test_the_read_path_header_names_the_layer_that_answered(
    client: AppClient, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not database_url.startswith("sqlite"):
        # several replicas would not see each other's commits: no cache, every read is
        # answered by the database (asserted by the next test)
        pytest.skip("the version read cache is on with SQLite only")
    # a verified key is remembered for seconds: long enough here on a machine however slow
    monkeypatch.setattr("service.auth.service.KNOWN_SECONDS", 3600.0)
    reader = bearer(await new_key(client, ["list_functions", "list_functions_details"]))
    fn = await create_fn(client)
    path = f"{V}/functions/{fn['id']}/versions/{fn['versionId']}"
    first = await client.get(path, headers=reader)
    second = await client.get(path, headers=reader)  # the key and the body are both cached
    assert first.headers["nvcf-read-path"] == "database"
    assert second.headers["nvcf-read-path"] == "fast-path"
    # a JWT is verified by the route, which then answers from the cache
    token = jwt.encode(
        {"sub": "nvcf-default", "scopes": ["list_functions"], "exp": int(time.time()) + 600},
        JWT_SECRET,
        algorithm="HS256",
    )
    by_jwt = await client.get(path, headers=bearer(token))
    assert by_jwt.headers["nvcf-read-path"] == "database"  # another scope set: another entry
    again = await client.get(path, headers=bearer(token))
    assert again.headers["nvcf-read-path"] == "cache"
    assert again.content == by_jwt.content
    # a change is seen at once, through the database
    put = await client.put(path, json={"description": "changed"})
    assert put.status_code == 200
    after = await client.get(path)
    assert after.headers["nvcf-read-path"] == "database"
    assert after.json()["function"]["description"] == "changed"


async def test_the_setting_turns_every_speed_up_off(client_factory: ClientFactory) -> None:
    client = await client_factory(version_read_cache=False)
    fn = await create_fn(client)
    path = f"{V}/functions/{fn['id']}/versions/{fn['versionId']}"
    reads = [await client.get(path) for _ in range(3)]
    assert [r.headers["nvcf-read-path"] for r in reads] == ["database"] * 3
    assert len({r.content for r in reads}) == 1


async def test_lists_are_cached_until_any_version_changes(
    client: AppClient, database_url: str
) -> None:
    if not database_url.startswith("sqlite"):
        pytest.skip("the version read cache is on with SQLite only")
    fn = await create_fn(client)
    lists = [f"{V}/functions", f"{V}/functions/{fn['id']}/versions"]
    for path in lists:
        first, second = await client.get(path), await client.get(path)
        assert first.headers["nvcf-read-path"] == "database"
        assert second.headers["nvcf-read-path"] == "cache"
        assert first.content == second.content
    # another account never sees this account's cached list
    other = bearer(await new_key(client, ["list_functions"], "another-account"))
    assert (await client.get(lists[0], headers=other)).json()["functions"] == []
    assert (await client.get(lists[1], headers=other)).status_code == 404
    # a new version shows at once
    created = await client.post(
        f"{V}/functions/{fn['id']}/versions",
        json={
            "name": "echo",
            "inferenceUrl": "/echo",
            "inferencePort": 8000,
            "containerImage": "nvcr.io/acme/e:2",
        },
    )
    assert created.status_code == 200
    for path in lists:
        after = await client.get(path)
        assert after.headers["nvcf-read-path"] == "database"
        assert len(after.json()["functions"]) == 2


async def test_a_version_stays_cached_while_other_deployments_change(
    client_factory: ClientFactory, tmp_path: Path, database_url: str
) -> None:
    if not database_url.startswith("sqlite"):
        pytest.skip("the version read cache is on with SQLite only")
    client = await client_factory(clusters_file=write_catalog(tmp_path, h100_nodes=2))
    spec = {"gpu": "H100", "backend": "e2e", "minInstances": 1, "maxInstances": 1}
    a, b = await create_fn(client), await create_fn(client)
    for fn in (a, b):
        resp = await client.post(dep_url(fn), json={"deploymentSpecifications": [spec]})
        assert resp.status_code == 200, resp.text
        await until_status(client, fn, "ACTIVE")
    maker: async_sessionmaker[AsyncSession] = client.app.state.sessionmaker

    async def instance_of(fn: dict[str, Any]) -> uuid.UUID:
        async with maker() as session:
            found = await session.scalar(
                select(Instance.id)
                .join(Deployment, Deployment.id == Instance.deployment_id)
                .where(Deployment.version_id == uuid.UUID(fn["versionId"]))
            )
        assert found is not None
        return found

    async def touch(fn: dict[str, Any]) -> None:
        """A change of the version's instance, as the reconciler writes one."""
        async with maker() as session, session.begin():
            row = await session.get(Instance, await instance_of(fn))
            assert row is not None
            row.message = "observed again"

    def path(fn: dict[str, Any]) -> str:
        return f"{V}/functions/{fn['id']}/versions/{fn['versionId']}"

    async def read_path(fn: dict[str, Any]) -> str:
        resp = await client.get(path(fn))
        assert resp.status_code == 200, resp.text
        assert len(resp.json()["function"]["activeInstances"]) == 1
        return resp.headers["nvcf-read-path"]

    for fn in (a, b):
        await read_path(fn)
        assert await read_path(fn) == "fast-path"
    # the other version's instance changes, the reconciler re-marks the whole fleet due (its
    # bookkeeping): the version stays cached
    await touch(b)
    assert await client.app.state.reconciler.request_resync() == 2
    assert [await read_path(a), await read_path(b)] == ["fast-path", "database"]
    # the other version's status moves, as when it converges (one bulk statement)
    async with maker() as session, session.begin():
        version = await session.get(FunctionVersion, uuid.UUID(b["versionId"]))
        assert version is not None
        dep_id = await session.scalar(
            select(Deployment.id).where(Deployment.version_id == version.id)
        )
        assert dep_id is not None
        change = StatusChange(dep_id, version, VersionStatus.DEGRADING)
        assert await set_version_statuses(session, [change], utcnow()) == [change]
    assert [await read_path(a), await read_path(b)] == ["fast-path", "database"]
    # its own instance changes: read again from the database
    await touch(a)
    assert await read_path(a) == "database"
    assert await read_path(a) == "fast-path"
    # a bulk statement naming no rows drops every version's details
    async with maker() as session, session.begin():
        await session.execute(update(Instance).values(message="bulk"))
    assert [await read_path(a), await read_path(b)] == ["database", "database"]
