"""The asset routes over HTTP in NVCF's shape, on the local store (this server signs and
serves the upload and download URLs), on SQLite and PostgreSQL.

The tests on `client` share one app per database, each in an account of its own (`admin` is
the operator's client of that app)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import pytest_asyncio

from service.assets.signing import Grant
from service.core.server import ConnectionLimits
from tests.support.api import assert_problem, bearer, new_key
from tests.support.app import AppClient, ClientFactory
from tests.support.assets import anonymous, as_account
from tests.support.browser import BrowserUnavailable, start_browser
from tests.support.e2e import eventually
from tests.support.server import in_loop_server

pytestmark = pytest.mark.asyncio(loop_scope="module")
# the tests that build their own app run in their own loop
own_app = pytest.mark.asyncio(loop_scope="function")

A = "/v2/nvcf/assets"


@pytest.fixture
def account() -> str:
    return f"acct-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def admin(module_client: AppClient) -> AppClient:
    return module_client


@pytest_asyncio.fixture(loop_scope="module")
async def client(admin: AppClient, account: str) -> AsyncIterator[AppClient]:
    """The module's app as seen by a key of the test's own account."""
    key = await new_key(admin, ["invoke_function"], account=account)
    async with AppClient(
        transport=httpx.ASGITransport(app=admin.app),
        base_url=str(admin.base_url),
        headers=bearer(key),
    ) as c:
        c.app = admin.app
        yield c


async def create(client: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    resp = await client.post(A, json={"contentType": "image/png", "description": "a cat", **body})
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


async def upload(client: AppClient, url: str, data: bytes | AsyncIterator[bytes]) -> httpx.Response:
    async with anonymous(client) as anon:
        return await anon.put(url, content=data)


async def test_create_upload_get_download_delete(client: AppClient) -> None:
    made = await create(client)
    assert set(made) == {"assetId", "uploadUrl", "contentType", "description"}
    assert made["contentType"] == "image/png" and made["description"] == "a cat"
    asset_id = made["assetId"]
    data = os.urandom(300_000)
    put = await upload(client, made["uploadUrl"], data)
    assert put.status_code == 200, put.text

    got = (await client.get(f"{A}/{asset_id}")).json()
    assert set(got["asset"]) == {"assetId", "description", "contentType", "createdAt"}
    assert got["asset"]["assetId"] == asset_id
    listed = (await client.get(A)).json()["assets"]
    assert [a["assetId"] for a in listed] == [asset_id]

    redirect = await client.get(f"{A}/{asset_id}/content-redirect")
    assert redirect.status_code == 200, redirect.text
    url = redirect.json()["presignedUrl"]
    async with anonymous(client) as anon:
        down = await anon.get(url)
        head = await anon.head(url)
    assert down.status_code == 200
    assert down.content == data
    assert down.headers["content-type"] == "image/png"
    assert head.status_code == 200 and head.headers["content-length"] == str(len(data))

    deleted = await client.delete(f"{A}/{asset_id}")
    assert deleted.status_code == 204 and deleted.content == b""
    assert_problem(await client.get(f"{A}/{asset_id}"), 404)
    assert (await client.get(A)).json()["assets"] == []
    async with anonymous(client) as anon:
        assert (await anon.get(url)).status_code == 404


async def test_another_account_sees_nothing(client: AppClient, admin: AppClient) -> None:
    made = await create(client)
    assert (await upload(client, made["uploadUrl"], b"data")).status_code == 200
    other_account = f"other-{uuid.uuid4().hex[:12]}"
    other = bearer(await new_key(admin, ["invoke_function"], account=other_account))
    asset = f"{A}/{made['assetId']}"
    for resp in (
        await client.get(asset, headers=other),
        await client.get(f"{asset}/content-redirect", headers=other),
        await client.delete(asset, headers=other),
    ):
        body = assert_problem(resp, 404)
        assert made["assetId"] in str(body["detail"])
    assert (await client.get(A, headers=other)).json()["assets"] == []
    assert (await client.get(asset)).status_code == 200  # still there for its owner


async def test_an_asset_not_yet_uploaded_is_not_found_as_on_nvcf(client: AppClient) -> None:
    """Issue 43: NVCF answers `GET` and `DELETE /v2/nvcf/assets/{id}` from its bucket, so an
    asset whose file is not uploaded is a 404 to both (and the delete changes nothing)."""
    made = await create(client)
    asset = f"{A}/{made['assetId']}"
    for resp in (await client.get(asset), await client.delete(asset)):
        assert "not been uploaded" in str(assert_problem(resp, 404)["detail"])
    assert (await upload(client, made["uploadUrl"], b"data")).status_code == 200
    assert (await client.get(asset)).json()["asset"]["assetId"] == made["assetId"]
    assert (await client.delete(asset)).status_code == 204


async def test_routes_need_the_invoke_scope(
    client: AppClient, admin: AppClient, account: str
) -> None:
    key = bearer(await new_key(admin, ["list_functions"], account=account))
    assert_problem(await client.get(A, headers=key), 403)
    assert_problem(
        await client.post(A, json={"contentType": "a/b", "description": ""}, headers=key), 403
    )
    async with anonymous(client) as anon:
        assert_problem(await anon.get(A), 401)


async def test_bad_create_bodies_name_every_violation(client: AppClient) -> None:
    body = assert_problem(await client.post(A, json={"contentType": "png"}), 400)
    fields = {e["field"] for e in body["errors"]}
    assert fields == {"contentType", "description"}
    body = assert_problem(
        await client.post(A, json={"contentType": "image/png; q=1", "description": "x" * 2000}), 400
    )
    assert len(body["errors"]) == 2
    assert_problem(await client.post(A, json=["not", "an", "object"]), 400)
    assert_problem(await client.get(f"{A}/not-a-uuid"), 400)
    assert (await client.get(A)).json()["assets"] == []


async def test_a_half_finished_upload_is_never_served(client: AppClient) -> None:
    made = await create(client)
    url = httpx.URL(made["uploadUrl"])
    limits = ConnectionLimits(
        header_timeout=10, body_timeout=10, keepalive_timeout=5, max_connections=100
    )
    async with in_loop_server(client.app, limits) as server:
        # the client promises 200 kB, sends half and goes away
        _reader, writer = await asyncio.open_connection("127.0.0.1", server.config.port)
        target = url.raw_path.decode()
        writer.write(
            f"PUT {target} HTTP/1.1\r\nHost: x\r\nContent-Length: 200000\r\n\r\n".encode()
            + b"x" * 100_000
        )
        await writer.drain()
        writer.close()
        await writer.wait_closed()
        body = assert_problem(await client.get(f"{A}/{made['assetId']}/content-redirect"), 404)
        assert "not been uploaded" in str(body["detail"])
        partial = client.app.state.assets.store.partial

        async def nothing_partial() -> bool:
            return not any(partial.iterdir())

        await eventually(nothing_partial)
    # the URL still works for a whole upload
    assert (await upload(client, made["uploadUrl"], b"whole")).status_code == 200
    assert (await client.get(f"{A}/{made['assetId']}/content-redirect")).status_code == 200


async def test_signed_urls_are_bound_to_their_object_method_and_time(client: AppClient) -> None:
    made = await create(client)
    url = httpx.URL(made["uploadUrl"])
    tampered = url.copy_set_param("maxBytes", "999999999999")
    put = await upload(client, str(tampered), b"data")
    assert "signature" in str(assert_problem(put, 403)["detail"])
    other_id = str(uuid.uuid4())
    moved = str(url).replace(made["assetId"], other_id)
    assert_problem(await upload(client, moved, b"data"), 403)
    async with anonymous(client) as anon:
        # an upload URL does not download
        assert_problem(await anon.get(str(url)), 400)


async def test_an_expired_signed_url_is_refused(client: AppClient) -> None:
    made = await create(client)
    signer = client.app.state.assets.signer
    key = f"assets/{made['assetId']}"
    past = int(time.time()) - 1
    url = signer.url(str(client.base_url), Grant("PUT", key, past, max_bytes=1000))
    body = assert_problem(await upload(client, url, b"data"), 403)
    assert "expired" in str(body["detail"])
    assert (await upload(client, made["uploadUrl"], b"data")).status_code == 200
    download = signer.url(str(client.base_url), Grant("GET", key, past, content_type="image/png"))
    async with anonymous(client) as anon:
        assert "expired" in str(assert_problem(await anon.get(download), 403)["detail"])


@own_app
async def test_an_upload_over_the_limit_is_refused(client_factory: ClientFactory) -> None:
    client = await client_factory(asset_max_bytes=1000)
    made = await create(client)
    body = assert_problem(await upload(client, made["uploadUrl"], b"x" * 1001), 413)
    assert "1000" in str(body["detail"])

    async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: bounded as it arrives
        for _ in range(3):
            yield b"y" * 600

    assert_problem(await upload(client, made["uploadUrl"], chunked()), 413)
    assert_problem(await client.get(f"{A}/{made['assetId']}/content-redirect"), 404)
    assert (await upload(client, made["uploadUrl"], b"x" * 1000)).status_code == 200


async def test_an_asset_is_uploaded_once(client: AppClient) -> None:
    made = await create(client)
    assert (await upload(client, made["uploadUrl"], b"first")).status_code == 200
    assert_problem(await upload(client, made["uploadUrl"], b"second"), 409)
    url = (await client.get(f"{A}/{made['assetId']}/content-redirect")).json()["presignedUrl"]
    async with anonymous(client) as anon:
        assert (await anon.get(url)).content == b"first"


@own_app
async def test_count_quota(client_factory: ClientFactory) -> None:
    client = await client_factory(quota_assets=2)
    await create(client)
    await create(client)
    body = assert_problem(await client.post(A, json={"contentType": "a/b", "description": ""}), 400)
    assert body["detail"] == (
        "Account 'nvcf-default': Reached or exceeded the max limit for the number of assets "
        "allowed: 2."
    )
    assert "NVCF_QUOTA_ASSETS" in str(body["errors"])
    other = await new_key(client, ["invoke_function"], account="other-account")
    async with as_account(client, other) as api:
        await create(api)  # another account's quota


@own_app
async def test_bytes_quota(client_factory: ClientFactory) -> None:
    client = await client_factory(quota_asset_bytes=1500)
    first = await create(client)
    # the upload URL carries the room left: the local store refuses more at once
    assert_problem(await upload(client, first["uploadUrl"], b"x" * 1501), 413)
    assert (await upload(client, first["uploadUrl"], b"x" * 1000)).status_code == 200
    assert (await client.get(f"{A}/{first['assetId']}/content-redirect")).status_code == 200
    second = await create(client)
    assert_problem(await upload(client, second["uploadUrl"], b"x" * 501), 413)
    assert (await upload(client, second["uploadUrl"], b"x" * 500)).status_code == 200
    assert (await client.get(f"{A}/{second['assetId']}/content-redirect")).status_code == 200
    body = assert_problem(await client.post(A, json={"contentType": "a/b", "description": ""}), 400)
    assert "the number of bytes of assets allowed: 1500." in str(body["detail"])
    assert "NVCF_QUOTA_ASSET_BYTES" in str(body["errors"])
    await client.delete(f"{A}/{first['assetId']}")
    await create(client)


@own_app
async def test_an_expired_asset_is_gone(client_factory: ClientFactory) -> None:
    client = await client_factory(asset_ttl_seconds=0.001)
    made = await create(client)
    assert_problem(await client.get(f"{A}/{made['assetId']}"), 404)
    assert (await client.get(A)).json()["assets"] == []
    purged = await client.app.state.assets.purge(client.app.state.sessionmaker)
    assert purged >= 1


async def test_sha_of_a_large_upload(client: AppClient) -> None:
    data = os.urandom(3 * 1024 * 1024)
    made = await create(client)
    assert (await upload(client, made["uploadUrl"], data)).status_code == 200
    url = (await client.get(f"{A}/{made['assetId']}/content-redirect")).json()["presignedUrl"]
    async with anonymous(client) as anon:
        got = (await anon.get(url)).content
    assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()


async def test_a_retried_create_is_one_asset(client: AppClient) -> None:
    key = {"Idempotency-Key": "create-asset-once"}
    body = {"contentType": "image/png", "description": "once"}
    first = await client.post(A, json=body, headers=key)
    again = await client.post(A, json=body, headers=key)
    assert first.status_code == again.status_code == 200
    assert again.headers.get("idempotent-replayed") == "true"
    assert again.json() == first.json()
    assert len((await client.get(A)).json()["assets"]) == 1


#: an asset that, rendered on the API's origin, would read what the console keeps there
PLANTED = (
    b"<!doctype html><title>x</title><script>"
    b"localStorage.setItem('planted-ran', sessionStorage.getItem('console-key') || 'yes')"
    b"</script>"
)


@pytest.mark.parametrize("content_type", ["text/html", "image/svg+xml", "application/javascript"])
async def test_a_download_is_never_rendered_on_the_api_origin(
    client: AppClient, content_type: str
) -> None:
    """Issue 40, D19: whatever type its owner declared, a download is an attachment, never
    sniffed, and sandboxed (an opaque origin, no script) should a browser render it."""
    made = await create(client, contentType=content_type)
    assert (await upload(client, made["uploadUrl"], PLANTED)).status_code == 200
    url = (await client.get(f"{A}/{made['assetId']}/content-redirect")).json()["presignedUrl"]
    async with anonymous(client) as anon:
        for resp in (await anon.get(url), await anon.head(url)):
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith(content_type)
            assert resp.headers["content-disposition"] == "attachment"
            assert resp.headers["x-content-type-options"] == "nosniff"
            assert resp.headers["content-security-policy"] == "sandbox"


async def test_a_planted_html_asset_runs_no_script_in_a_real_browser(
    client: AppClient, tmp_path: Path
) -> None:
    """Issue 40, D19, as a browser sees it: a tab on the API's origin holding a key in
    sessionStorage opens a tenant's `text/html` asset by its signed URL; the asset's script
    never runs on that origin."""
    try:
        driver = await anyio.to_thread.run_sync(start_browser, tmp_path / "profile")
    except BrowserUnavailable as exc:
        pytest.skip(str(exc))
    limits = ConnectionLimits(
        header_timeout=10, body_timeout=10, keepalive_timeout=5, max_connections=100
    )
    try:
        async with in_loop_server(client.app, limits) as server:
            origin = f"http://127.0.0.1:{server.config.port}"
            async with httpx.AsyncClient(base_url=origin, headers=client.headers) as api:
                made = await create(api, contentType="text/html")
                async with httpx.AsyncClient() as plain:
                    put = await plain.put(made["uploadUrl"], content=PLANTED)
                    assert put.status_code == 200, put.text
                redirect = await api.get(f"{A}/{made['assetId']}/content-redirect")
                url = redirect.json()["presignedUrl"]
            assert url.startswith(origin)

            def visit() -> object:
                driver.get(f"{origin}/health")
                driver.execute_script("sessionStorage.setItem('console-key', 'nvapi-secret')")
                driver.get(url)
                driver.get(f"{origin}/health")
                return driver.execute_script("return localStorage.getItem('planted-ran')")

            assert await anyio.to_thread.run_sync(visit) is None
    finally:
        await anyio.to_thread.run_sync(driver.quit)
