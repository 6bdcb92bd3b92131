"""The object stores behind assets and large results. The S3 one against moto's server (the
S3 wire protocol, a process of its own) behind a gate that checks pre-signed URLs as S3 does
(tests/support/s3_gate.py): uploads as NVCF's clients send them (no key; the content type and
description headers the URL signs); a larger object than allowed refused at first use;
downloads, fetches into a request's directory, large results and the purge. The local
store's own rules are in test_router.py."""

from __future__ import annotations

import hashlib
import io
import os
import uuid
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.assets.files import RequestFiles
from service.assets.results import store_result
from service.assets.storage import S3Store
from service.core.errors import ValidationFailed
from tests.support.app import AppClient, ClientFactory
from tests.support.assets import nvcf_upload_headers
from tests.support.s3 import S3Server

A = "/v2/nvcf/assets"


@pytest.fixture
async def s3_client(client_factory: ClientFactory, s3_server: S3Server) -> AppClient:
    return await client_factory(**s3_server.settings(s3_server.new_bucket()))


async def create(client: httpx.AsyncClient) -> dict[str, Any]:
    resp = await client.post(A, json={"contentType": "video/mp4", "description": "clip"})
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


async def resolve(client: AppClient, *ids: str) -> list[Any]:
    assets = client.app.state.assets
    async with client.app.state.sessionmaker() as session, session.begin():
        resolved: list[Any] = await assets.resolve(
            session, "nvcf-default", [uuid.UUID(i) for i in ids]
        )
    return resolved


async def test_upload_with_a_plain_put_then_download(
    s3_client: AppClient, s3_server: S3Server
) -> None:
    assert isinstance(s3_client.app.state.assets.store, S3Store)
    made = await create(s3_client)
    assert made["uploadUrl"].startswith(s3_server.endpoint)
    data = os.urandom(1024 * 1024)
    async with httpx.AsyncClient() as plain:  # no key, no content type
        put = await plain.put(made["uploadUrl"], content=data, headers=nvcf_upload_headers(made))
        assert put.status_code == 200, put.text
        # not uploaded until the store has it all: resolved only now
        found = await resolve(s3_client, made["assetId"])
        assert found[0].size_bytes == len(data)
        redirect = await s3_client.get(f"{A}/{made['assetId']}/content-redirect")
        down = await plain.get(redirect.json()["presignedUrl"])
    assert down.status_code == 200
    assert down.headers["content-type"] == "video/mp4"
    assert hashlib.sha256(down.content).digest() == hashlib.sha256(data).digest()


async def test_the_upload_url_signs_what_nvcf_signs(
    s3_client: AppClient, s3_server: S3Server
) -> None:
    """Issue 43: NVCF signs the content type and `x-amz-meta-nvcf-asset-description` into an
    asset's upload URL and its clients send both; S3 refuses an `x-amz-*` header the URL does
    not sign, and a URL whose signed headers are not sent as signed. A plain `curl -T` (no
    headers) is therefore refused by S3, as by NVCF's own S3; with the two headers it works."""
    made = await create(s3_client)
    url = httpx.URL(made["uploadUrl"])
    signed = url.params["X-Amz-SignedHeaders"].split(";")
    assert {"content-type", "x-amz-meta-nvcf-asset-description"} <= set(signed)
    headers = nvcf_upload_headers(made)
    async with httpx.AsyncClient() as plain:
        bare = await plain.put(str(url), content=b"data")  # `curl -T FILE URL`
        assert bare.status_code == 403 and b"SignatureDoesNotMatch" in bare.content
        other = await plain.put(
            str(url), content=b"data", headers={**headers, "Content-Type": "a/b"}
        )
        assert other.status_code == 403 and b"SignatureDoesNotMatch" in other.content
        extra = await plain.put(
            str(url), content=b"data", headers={**headers, "x-amz-acl": "public-read"}
        )
        assert extra.status_code == 403 and b"not signed" in extra.content
        assert await s3_client.app.state.assets.store.size(f"assets/{made['assetId']}") is None
        put = await plain.put(str(url), content=b"data", headers=headers)
        assert put.status_code == 200, put.text
    head = s3_server.client().head_object(
        Bucket=s3_client.app.state.settings.asset_s3_bucket, Key=f"assets/{made['assetId']}"
    )
    assert head["ContentType"] == "video/mp4"
    assert head["Metadata"] == {"nvcf-asset-description": "clip"}


async def test_not_uploaded_unknown_and_deleted(s3_client: AppClient, s3_server: S3Server) -> None:
    made = await create(s3_client)
    with pytest.raises(ValidationFailed) as caught:
        await resolve(s3_client, made["assetId"])
    assert "not been uploaded" in caught.value.errors[0].message
    assert (await s3_client.get(f"{A}/{made['assetId']}/content-redirect")).status_code == 404
    async with httpx.AsyncClient() as plain:
        await plain.put(made["uploadUrl"], content=b"x", headers=nvcf_upload_headers(made))
    assert (await s3_client.delete(f"{A}/{made['assetId']}")).status_code == 204
    with pytest.raises(ValidationFailed):
        await resolve(s3_client, made["assetId"])
    assert (
        s3_server.client()
        .list_objects_v2(Bucket=s3_client.app.state.settings.asset_s3_bucket)
        .get("KeyCount")
        == 0
    )


async def test_an_object_over_the_limit_is_refused_at_first_use(
    client_factory: ClientFactory, s3_server: S3Server
) -> None:
    client = await client_factory(**s3_server.settings(s3_server.new_bucket()), asset_max_bytes=100)
    made = await create(client)
    async with httpx.AsyncClient() as plain:
        # S3 cannot bound a PUT: the store takes it ...
        put = await plain.put(
            made["uploadUrl"], content=b"x" * 101, headers=nvcf_upload_headers(made)
        )
        assert put.status_code == 200
    # ... and the first use refuses and deletes it
    with pytest.raises(ValidationFailed) as caught:
        await resolve(client, made["assetId"])
    assert "NVCF_ASSET_MAX_BYTES" in caught.value.errors[0].message
    assert await client.app.state.assets.store.size(f"assets/{made['assetId']}") is None


async def test_s3_uploads_never_pass_the_byte_quota(
    client_factory: ClientFactory, s3_server: S3Server
) -> None:
    """Issue 40, D21 on S3, which cannot bound a PUT: an object that passes the account's
    room is refused and deleted when the account next signs an upload URL, and that URL is
    refused while the asset holds its room."""
    client = await client_factory(
        **s3_server.settings(s3_server.new_bucket()), quota_asset_bytes=1_000_000
    )
    bucket = client.app.state.settings.asset_s3_bucket
    first = await create(client)
    async with httpx.AsyncClient() as plain:
        headers = nvcf_upload_headers(first)
        assert (
            await plain.put(first["uploadUrl"], content=b"x" * 900_000, headers=headers)
        ).status_code == 200
        second = await create(client)
        headers = nvcf_upload_headers(second)
        assert (
            await plain.put(second["uploadUrl"], content=b"x" * 900_000, headers=headers)
        ).status_code == 200
    third = await client.post(A, json={"contentType": "video/mp4", "description": "clip"})
    assert third.status_code == 400 and "NVCF_QUOTA_ASSET_BYTES" in third.text
    listed = s3_server.client().list_objects_v2(Bucket=bucket).get("Contents", [])
    assert sum(o["Size"] for o in listed) <= 1_000_000
    assert [o["Key"] for o in listed] == [f"assets/{first['assetId']}"]


async def test_signed_urls_expire_after_the_setting(
    client_factory: ClientFactory, s3_server: S3Server
) -> None:
    """What is signed is the setting's expiry (the gate, as S3, refuses a URL past it)."""
    client = await client_factory(
        **s3_server.settings(s3_server.new_bucket()), asset_url_seconds=120
    )
    made = await create(client)
    assert httpx.URL(made["uploadUrl"]).params["X-Amz-Expires"] == "120"
    async with httpx.AsyncClient() as plain:
        await plain.put(made["uploadUrl"], content=b"x", headers=nvcf_upload_headers(made))
    redirect = await client.get(f"{A}/{made['assetId']}/content-redirect")
    assert httpx.URL(redirect.json()["presignedUrl"]).params["X-Amz-Expires"] == "120"


async def test_fetch_into_a_request_directory_and_large_results(
    s3_client: AppClient, tmp_path: Path
) -> None:
    made = await create(s3_client)
    data = os.urandom(300_000)
    async with httpx.AsyncClient() as plain:
        await plain.put(made["uploadUrl"], content=data, headers=nvcf_upload_headers(made))
    assets = s3_client.app.state.assets
    resolved = await resolve(s3_client, made["assetId"])
    rid = uuid.uuid4()
    files = await RequestFiles.prepare(assets.store, tmp_path, rid, resolved)
    assert (files.asset_dir / made["assetId"]).read_bytes() == data
    (files.output_dir / "out.bin").write_bytes(data[::-1])

    async def body() -> AsyncIterator[bytes]:
        yield b"answer"

    url = await store_result(assets, rid, body(), files, "http://unused/")
    await files.remove()
    async with httpx.AsyncClient() as plain:
        got = await plain.get(url)
    assert got.status_code == 200
    archive = zipfile.ZipFile(io.BytesIO(got.content))
    assert archive.read(f"{rid}.response") == b"answer"
    assert archive.read("out.bin") == data[::-1]


async def test_purge_on_s3(client_factory: ClientFactory, s3_server: S3Server) -> None:
    client = await client_factory(
        **s3_server.settings(s3_server.new_bucket()),
        asset_ttl_seconds=0.001,
        invoke_result_ttl_seconds=0.001,
    )
    made = await create(client)
    async with httpx.AsyncClient() as plain:
        await plain.put(made["uploadUrl"], content=b"x", headers=nvcf_upload_headers(made))
    assets = client.app.state.assets

    async def body() -> AsyncIterator[bytes]:
        yield b"answer"

    rid = uuid.uuid4()
    await store_result(assets, rid, body(), None, "http://unused/")
    assert await assets.purge(client.app.state.sessionmaker) == 2
    assert await assets.store.size(f"assets/{made['assetId']}") is None
    assert await assets.store.size(f"results/{rid}") is None
