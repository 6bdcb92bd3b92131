"""Reads of one version never go stale: every committed change reaches the next GET."""

from __future__ import annotations

import uuid

from sqlalchemy import update

from service.functions.models import FunctionVersion
from tests.support.api import create_fn
from tests.support.app import AppClient

V = "/v2/nvcf"


async def _status_via_other_session(client: AppClient, vid: str, status: str, bulk: bool) -> None:
    """Change a version the way the reconciler does: its own session, not a request."""
    async with client.app.state.sessionmaker() as session, session.begin():
        if bulk:
            await session.execute(
                update(FunctionVersion)
                .where(FunctionVersion.id == uuid.UUID(vid))
                .values(status=status)
            )
        else:
            version = await session.get(FunctionVersion, uuid.UUID(vid))
            assert version is not None
            version.status = status


async def test_get_reflects_every_kind_of_change(client: AppClient) -> None:
    fn = await create_fn(client)
    path = f"{V}/functions/{fn['id']}/versions/{fn['versionId']}"
    assert (await client.get(path)).json()["function"]["status"] == "INACTIVE"
    assert (await client.get(path)).json()["function"]["status"] == "INACTIVE"  # served twice

    await client.put(path, json={"description": "edited"})
    assert (await client.get(path)).json()["function"]["description"] == "edited"

    await _status_via_other_session(client, fn["versionId"], "DEPLOYING", bulk=False)
    assert (await client.get(path)).json()["function"]["status"] == "DEPLOYING"

    await _status_via_other_session(client, fn["versionId"], "ACTIVE", bulk=True)
    assert (await client.get(path)).json()["function"]["status"] == "ACTIVE"

    assert (await client.delete(path)).status_code == 204
    assert (await client.get(path)).status_code == 404


async def test_a_rolled_back_change_is_not_seen_and_does_not_poison(client: AppClient) -> None:
    fn = await create_fn(client)
    path = f"{V}/functions/{fn['id']}/versions/{fn['versionId']}"
    await client.get(path)
    async with client.app.state.sessionmaker() as session:
        version = await session.get(FunctionVersion, uuid.UUID(fn["versionId"]))
        assert version is not None
        version.status = "ERROR"
        await session.flush()
        await session.rollback()
    assert (await client.get(path)).json()["function"]["status"] == "INACTIVE"


async def test_cached_responses_stay_per_account(client: AppClient) -> None:
    from tests.support.api import bearer, new_key

    fn = await create_fn(client)
    path = f"{V}/functions/{fn['id']}/versions/{fn['versionId']}"
    assert (await client.get(path)).status_code == 200
    other = bearer(await new_key(client, ["list_functions"], account="intruder"))
    assert (await client.get(path, headers=other)).status_code == 404
