"""`/docs` and `/redoc` work offline: every URL they load is served by this server."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import httpx
import pytest

from service.core.docs_ui import ASSETS, ASSETS_PREFIX

ANON = {"Authorization": ""}
#: the pages do not touch the database: one backend is enough
pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


class _Refs(HTMLParser):
    """Every URL a browser would load: src/href attributes and url(...) in inline styles."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls.extend(v for k, v in attrs if k in {"src", "href"} and v)


def loaded_urls(html: str) -> list[str]:
    parser = _Refs()
    parser.feed(html)
    # Swagger UI's init script names the document and the assets as JavaScript strings too.
    quoted = re.findall(r"""['"]((?:https?:)?//[^'"]+|/[^'"\s]*)['"]""", html)
    return parser.urls + quoted


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_doc_pages_load_nothing_from_another_host(
    client: httpx.AsyncClient, page: str
) -> None:
    resp = await client.get(page, headers=ANON)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/html")
    urls = loaded_urls(resp.text)
    assert urls, resp.text
    external = [u for u in urls if re.match(r"^(https?:)?//", u)]
    assert external == []
    assert "fonts.googleapis" not in resp.text and "cdn." not in resp.text
    assets = {u.split("?")[0] for u in urls if u.startswith(ASSETS_PREFIX)}
    expected = (
        {f"{ASSETS_PREFIX}/swagger-ui-bundle.js", f"{ASSETS_PREFIX}/swagger-ui.css"}
        if page == "/docs"
        else {f"{ASSETS_PREFIX}/redoc.standalone.js"}
    )
    assert expected | {f"{ASSETS_PREFIX}/favicon.png"} == assets
    assert "/openapi.json" in urls
    for url in {u for u in urls if u.startswith(ASSETS_PREFIX)}:
        asset = await client.get(url, headers=ANON)
        assert asset.status_code == 200, url
        assert len(asset.content) > 0


async def test_assets_are_the_real_bundles_with_their_media_types(
    client: httpx.AsyncClient,
) -> None:
    for name, media_type in ASSETS.items():
        resp = await client.get(f"{ASSETS_PREFIX}/{name}", headers=ANON)
        assert resp.status_code == 200, name
        assert resp.headers["content-type"] == media_type
        assert "max-age" in resp.headers["cache-control"]
    js = (await client.get(f"{ASSETS_PREFIX}/swagger-ui-bundle.js")).text
    assert "SwaggerUIBundle" in js and len(js) > 100_000
    redoc = (await client.get(f"{ASSETS_PREFIX}/redoc.standalone.js")).text
    assert "Redoc" in redoc and len(redoc) > 100_000
    css = (await client.get(f"{ASSETS_PREFIX}/swagger-ui.css")).text
    assert ".swagger-ui" in css


@pytest.mark.parametrize(
    "name", ["missing.js", "..%2Fcore.py", "..%2F..%2F__init__.py", "%2Fetc%2Fpasswd"]
)
async def test_only_the_listed_assets_are_served(client: httpx.AsyncClient, name: str) -> None:
    resp = await client.get(f"{ASSETS_PREFIX}/{name}", headers=ANON)
    assert resp.status_code == 404
    assert resp.headers["content-type"] == "application/problem+json"
