"""Helpers of the asset tests: a client with no API key on the same app (what `curl` with a
signed URL is), and assets made and uploaded through the routes."""

from __future__ import annotations

import httpx

from tests.support.app import AppClient

ASSETS = "/v2/nvcf/assets"


def nvcf_upload_headers(made: dict[str, str]) -> dict[str, str]:
    """The headers NVCF's clients send with an asset's upload (what its S3 URL signs), for
    the asset `made` as `POST /v2/nvcf/assets` answered."""
    return {
        "Content-Type": made["contentType"],
        "x-amz-meta-nvcf-asset-description": made["description"],
    }


def anonymous(client: AppClient) -> httpx.AsyncClient:
    """A client of `client`'s app that carries no API key."""
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=client.app), base_url=str(client.base_url)
    )


def as_account(client: AppClient, key: str) -> httpx.AsyncClient:
    """A client of `client`'s app with another API key."""
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=client.app),
        base_url=str(client.base_url),
        headers={"Authorization": f"Bearer {key}"},
    )


async def uploaded(
    client: AppClient, data: bytes | None = b"data", *, key: str | None = None
) -> str:
    """A new asset's id, its file uploaded through the signed URL (unless `data` is None)."""
    api = as_account(client, key) if key is not None else client
    resp = await api.post(ASSETS, json={"contentType": "text/plain", "description": "d"})
    assert resp.status_code == 200, resp.text
    made = resp.json()
    if data is not None:
        async with anonymous(client) as anon:
            assert (await anon.put(made["uploadUrl"], content=data)).status_code == 200
    return str(made["assetId"])
