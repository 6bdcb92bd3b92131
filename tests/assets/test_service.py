"""Resolving an invocation's asset references (what the engine admits with), parsing NVCF's
header, and the purge, on SQLite and PostgreSQL with the local store."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from service.assets import repository
from service.assets.service import Assets, parse_references
from service.core.db import utcnow
from service.core.errors import ValidationFailed
from tests.support.api import new_key
from tests.support.app import AppClient, ClientFactory
from tests.support.assets import anonymous, uploaded

A = "/v2/nvcf/assets"
ACCOUNT = "nvcf-default"


async def resolve(client: AppClient, ids: list[Any], account: str = ACCOUNT) -> list[Any]:
    assets: Assets = client.app.state.assets
    async with client.app.state.sessionmaker() as session, session.begin():
        return await assets.resolve(session, account, [uuid.UUID(str(i)) for i in ids])


async def test_resolve_gives_the_assets_in_order_with_their_sizes(client: AppClient) -> None:
    first = await uploaded(client, b"12345")
    second = await uploaded(client, b"1234567")
    found = await resolve(client, [second, first])
    assert [str(a.id) for a in found] == [second, first]
    assert [a.size_bytes for a in found] == [7, 5]


async def test_every_bad_reference_is_named_in_one_refusal(
    client_factory: ClientFactory,
) -> None:
    client = await client_factory()
    good = await uploaded(client)
    unfinished = await uploaded(client, None)
    unknown = str(uuid.uuid4())
    other = await new_key(client, ["invoke_function"], account="other-account")
    foreign = await uploaded(client, key=other)
    with pytest.raises(ValidationFailed) as caught:
        await resolve(client, [good, unfinished, unknown, foreign])
    messages = [e.message for e in caught.value.errors]
    assert len(messages) == 3
    assert any(unknown in m and "does not exist" in m for m in messages)
    assert any(foreign in m and "does not exist" in m for m in messages)
    assert any(unfinished in m and "not been uploaded" in m for m in messages)
    assert all(e.field == "NVCF-INPUT-ASSET-REFERENCES" for e in caught.value.errors)
    assert caught.value.status == 400


async def test_an_expired_reference_is_named(client_factory: ClientFactory) -> None:
    client = await client_factory(asset_ttl_seconds=0.001)
    expired = await uploaded(client)
    with pytest.raises(ValidationFailed) as caught:
        await resolve(client, [expired])
    assert expired in caught.value.errors[0].message
    assert "expired" in caught.value.errors[0].message


async def test_a_reference_past_the_byte_quota_is_refused_and_its_upload_deleted(
    client_factory: ClientFactory,
) -> None:
    """An object larger than its room (S3 cannot bound a PUT: written here straight into the
    store) is refused when it is confirmed, and deleted; the asset can be uploaded again."""
    client = await client_factory(quota_asset_bytes=10)
    a = await client.post(A, json={"contentType": "text/plain", "description": ""})
    async with anonymous(client) as anon:
        assert (await anon.put(a.json()["uploadUrl"], content=b"x" * 8)).status_code == 200
    b = await client.post(A, json={"contentType": "text/plain", "description": ""})
    assert b.status_code == 200, b.text  # signed with the 2 bytes of room left
    store = client.app.state.assets.store
    b_id = b.json()["assetId"]
    store.path(f"assets/{b_id}").write_bytes(b"x" * 8)
    with pytest.raises(ValidationFailed) as caught:
        await resolve(client, [b_id])
    assert "NVCF_QUOTA_ASSET_BYTES" in caught.value.errors[0].message
    assert await store.size(f"assets/{b_id}") is None
    async with anonymous(client) as anon:
        assert (await anon.put(b.json()["uploadUrl"], content=b"x" * 3)).status_code == 413
        assert (await anon.put(b.json()["uploadUrl"], content=b"x" * 2)).status_code == 200
    await resolve(client, [b_id])


async def test_uploads_never_pass_the_byte_quota(client_factory: ClientFactory) -> None:
    """Issue 40, D21: with a quota of 1 MB, eight assets of 900 kB uploaded and never used
    were all accepted (the bytes were counted only at an asset's first use). An asset not yet
    uploaded now holds room until it is, so an account never holds more than its quota."""
    client = await client_factory(quota_asset_bytes=1_000_000)
    store = client.app.state.assets.store
    accepted: list[str] = []
    refused = 0
    for _ in range(8):
        made = await client.post(A, json={"contentType": "text/plain", "description": ""})
        if made.status_code != 200:
            assert "NVCF_QUOTA_ASSET_BYTES" in made.text
            refused += 1
            continue
        async with anonymous(client) as anon:
            put = await anon.put(made.json()["uploadUrl"], content=b"x" * 900_000)
        if put.status_code == 200:
            accepted.append(made.json()["assetId"])
        else:
            assert put.status_code == 413
    assert len(accepted) == 1 and refused >= 6
    held = [await store.size(f"assets/{i}") for i in accepted]
    assert sum(s or 0 for s in held) <= 1_000_000
    # the one uploaded is there to use; deleting it gives the room back
    await resolve(client, accepted)
    assert (await client.delete(f"{A}/{accepted[0]}")).status_code == 204
    # (the asset refused at its upload still holds room until its upload window is over)
    assets = client.app.state.assets
    async with client.app.state.sessionmaker() as session, session.begin():
        waiting = await repository.pending(session, utcnow(), 100, account_id="nvcf-default")
        assert len(waiting) == 1
        later = utcnow() + assets.upload_window()
        assert await assets.settle(session, waiting, later) == []
    again = await client.post(A, json={"contentType": "text/plain", "description": ""})
    assert again.status_code == 200, again.text


async def test_purge_removes_expired_assets_and_their_files(
    client_factory: ClientFactory,
) -> None:
    client = await client_factory(asset_ttl_seconds=0.001)
    asset_id = await uploaded(client)
    store = client.app.state.assets.store
    assert await store.size(f"assets/{asset_id}") == 4
    assert await client.app.state.assets.purge(client.app.state.sessionmaker) == 1
    assert await store.size(f"assets/{asset_id}") is None
    with pytest.raises(ValidationFailed):
        await resolve(client, [asset_id])


def test_references_are_read_as_nvcf_reads_them() -> None:
    a, b, c = (uuid.uuid4() for _ in range(3))
    assert parse_references([f"{a},{b}, {c}", f"{a}", " , "], "h", 10) == [a, b, c]
    assert parse_references([""], "h", 10) == []


def test_bad_references_are_each_named() -> None:
    with pytest.raises(ValidationFailed) as caught:
        parse_references([f"nope,{uuid.uuid4()},also-bad"], "h", 10)
    assert [e.message.split("'")[1] for e in caught.value.errors] == ["nope", "also-bad"]
    with pytest.raises(ValidationFailed) as caught:
        parse_references([",".join(str(uuid.uuid4()) for _ in range(4))], "h", 3)
    assert "NVCF_ASSET_MAX_REFERENCES" in caught.value.errors[0].message
