"""`/docs` and `/redoc` work offline: every URL they load is served by this server."""

from __future__ import annotations

import base64
import hashlib
import re
import time
from collections.abc import Iterator
from html.parser import HTMLParser

import httpx
import pytest
from selenium.webdriver.common.by import By

from service.core.docs_ui import ASSETS, ASSETS_PREFIX
from tests.support.browser import BrowserUnavailable, NetworkLog, start_browser
from tests.support.wire import running_server

ANON = {"Authorization": ""}
#: the pages do not touch the database: one backend is enough (for the in-process app)
sqlite_only = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


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


@sqlite_only
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


@sqlite_only
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


@sqlite_only
@pytest.mark.parametrize(
    "name", ["missing.js", "..%2Fcore.py", "..%2F..%2F__init__.py", "%2Fetc%2Fpasswd"]
)
async def test_only_the_listed_assets_are_served(client: httpx.AsyncClient, name: str) -> None:
    resp = await client.get(f"{ASSETS_PREFIX}/{name}", headers=ANON)
    assert resp.status_code == 404
    assert resp.headers["content-type"] == "application/problem+json"


def _policy(header: str) -> dict[str, list[str]]:
    return {d.split()[0]: d.split()[1:] for d in (p.strip() for p in header.split(";")) if d}


@sqlite_only
@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_doc_pages_have_a_content_security_policy(
    client: httpx.AsyncClient, page: str
) -> None:
    resp = await client.get(page, headers=ANON)
    policy = _policy(resp.headers["content-security-policy"])
    assert policy["frame-ancestors"] == ["'none'"]
    assert policy["default-src"] == ["'none'"]
    assert policy["object-src"] == policy["base-uri"] == policy["form-action"] == ["'none'"]
    assert policy["connect-src"] == ["'self'"]
    # scripts: this server's, and the page's own inline start-up script by its hash alone
    inline = re.findall(r"<script>(.*?)</script>", resp.text, re.DOTALL)
    hashes = [
        "'sha256-" + base64.b64encode(hashlib.sha256(s.encode()).digest()).decode() + "'"
        for s in inline
    ]
    assert policy["script-src"] == ["'self'", *hashes]
    assert len(hashes) == (1 if page == "/docs" else 0)
    assert resp.headers["x-frame-options"] == "DENY"


@pytest.fixture(scope="module")
def docs_browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NetworkLog, str]]:
    """The server process and a headless Chromium (skipped where none is installed)."""
    tmp = tmp_path_factory.mktemp("docs")
    try:
        driver = start_browser(tmp / "profile")
    except BrowserUnavailable as exc:
        pytest.skip(str(exc))
    try:
        with running_server(tmp / "data") as port:
            yield NetworkLog(driver), f"http://127.0.0.1:{port}"
    finally:
        driver.quit()


@pytest.mark.parametrize(
    ("page", "rendered"), [("/docs", ".swagger-ui .info .title"), ("/redoc", ".api-info h1")]
)
def test_doc_pages_render_under_their_policy_in_a_real_browser(
    docs_browser: tuple[NetworkLog, str], page: str, rendered: str
) -> None:
    network, base = docs_browser
    network.problems()
    network.console.clear()
    network.driver.get(base + page)
    deadline = time.monotonic() + 30
    while not network.driver.find_elements(By.CSS_SELECTOR, rendered):
        assert time.monotonic() < deadline, f"{page} did not render: {network.problems()}"
        time.sleep(0.1)
    title = network.driver.find_element(By.CSS_SELECTOR, rendered).text
    assert "NVCF" in title or "nvcf" in title.lower(), title
    # no CSP violation, no failed load, no script error: but ReDoc's footer logo from its
    # vendor's CDN, which the policy keeps out (the pages load nothing from another host)
    problems = [
        p
        for p in network.problems()
        if not re.search(r"Loading the image 'https://cdn\.redoc\.ly/[^']*' violates", p["message"])
    ]
    assert problems == []
