"""`/docs` (Swagger UI) and `/redoc` from files installed with the package, so both work offline.

FastAPI's own pages load Swagger UI, ReDoc, a favicon and Google Fonts from public hosts: on
a machine without internet access they stay blank. The scripts and the stylesheet come from
the `fastapi-offline` package (which vendors swagger-ui-dist and the ReDoc standalone
bundle); they are served by name from a fixed list, never as a directory.

Both pages are same-origin HTML next to the console, so they get a Content-Security-Policy of
their own: scripts from this server and the page's one inline start-up script (allowed by its
hash, worked out from the page as rendered), styles from this server and inline (Swagger UI and
ReDoc set styles from their scripts; ReDoc writes `<style>` elements), images from this server
and `data:` URLs (the bundles' icons), ReDoc's search worker from a `blob:` URL, requests to
this server only, and no framing (`frame-ancestors 'none'`).
"""

from __future__ import annotations

import base64
import hashlib
import re
from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse

from service.core.errors import NotFound

ASSETS_PREFIX = "/docs/assets"
#: asset name -> media type; nothing else under ASSETS_PREFIX is served
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "redoc.standalone.js": "text/javascript; charset=utf-8",
    "favicon.png": "image/png",
}
#: a week: the files change only with the installed package, and its version is in the URL
_CACHE = "public, max-age=604800"
#: the policy of both pages but for their inline script's hash (see the module docstring)
_POLICY = (
    "default-src 'none'",
    "script-src {scripts}",
    "style-src 'self' 'unsafe-inline'",
    "img-src 'self' data:",
    "font-src 'self'",
    "connect-src 'self'",
    "worker-src 'self' blob:",
    "manifest-src 'none'",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'none'",
    "frame-ancestors 'none'",
)
_INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)


def content_security_policy(html: str) -> str:
    """The pages' policy, allowing the inline scripts of `html` by their SHA-256 hashes."""
    scripts = ["'self'"] + [
        "'sha256-" + base64.b64encode(hashlib.sha256(s.encode()).digest()).decode() + "'"
        for s in _INLINE_SCRIPT.findall(html)
    ]
    return "; ".join(_POLICY).replace("{scripts}", " ".join(scripts))


def _with_policy(page: HTMLResponse) -> HTMLResponse:
    page.headers["Content-Security-Policy"] = content_security_policy(bytes(page.body).decode())
    page.headers["X-Frame-Options"] = "DENY"
    page.headers["Referrer-Policy"] = "no-referrer"
    return page


def assets_dir() -> Path:
    return Path(str(files("fastapi_offline") / "static"))


def asset_version() -> str:
    from importlib.metadata import version

    return version("fastapi-offline")


def install_docs(app: FastAPI) -> None:
    """Serve `/docs`, `/redoc` and their assets (the app is built with docs_url=None)."""
    static = assets_dir()
    query = f"?v={asset_version()}"

    def asset(request: Request, name: str) -> str:
        return f"{request.scope.get('root_path', '')}{ASSETS_PREFIX}/{name}{query}"

    def openapi_url(request: Request) -> str:
        return f"{request.scope.get('root_path', '')}{app.openapi_url}"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        page = get_swagger_ui_html(
            openapi_url=openapi_url(request),
            title=f"{app.title} - Swagger UI",
            swagger_js_url=asset(request, "swagger-ui-bundle.js"),
            swagger_css_url=asset(request, "swagger-ui.css"),
            swagger_favicon_url=asset(request, "favicon.png"),
            oauth2_redirect_url=None,
            swagger_ui_parameters=app.swagger_ui_parameters,
        )
        return _with_policy(page)

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        page = get_redoc_html(
            openapi_url=openapi_url(request),
            title=f"{app.title} - ReDoc",
            redoc_js_url=asset(request, "redoc.standalone.js"),
            redoc_favicon_url=asset(request, "favicon.png"),
            with_google_fonts=False,
        )
        return _with_policy(page)

    @app.get(ASSETS_PREFIX + "/{name}", include_in_schema=False)
    async def docs_asset(name: str) -> FileResponse:
        media_type = ASSETS.get(name)
        if media_type is None:
            raise NotFound(detail=f"no documentation asset '{name}'")
        return FileResponse(static / name, media_type=media_type, headers={"Cache-Control": _CACHE})
