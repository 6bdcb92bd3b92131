"""The read-only web console at `/console` (docs/console.md).

A static page over the public API: the browser keeps the API key the user pastes in
sessionStorage and sends it only as the `Authorization` header of `/v2/nvcf` (and NVCT's
`/v1/nvct`) requests to this same origin. The server holds no console state and adds no route
that reads data: everything the page shows comes from the API, under the key's own scopes.

The page, its script, its stylesheet, its icon and the vendored YAML parser are files of
this package, served by name from a fixed list (never as a directory), each response with a
Content-Security-Policy that allows nothing but this origin, no inline script or style, no
frames, no form submissions, and Trusted Types (the script never writes HTML: it builds DOM
nodes and sets text).
"""

from __future__ import annotations

import hashlib
import html
from importlib.resources import files
from pathlib import Path
from string import Template

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse

from service.core.errors import NotFound

CONSOLE_PATH = "/console"
ASSETS_PREFIX = CONSOLE_PATH + "/assets"
#: asset name -> media type; nothing else under ASSETS_PREFIX is served
ASSETS = {
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
    # vendored from the npm registry (docs/console.md "Vendored code"); console.js imports it
    "js-yaml.esm.min.mjs": "text/javascript; charset=utf-8",
}
#: assets kept under static/vendor/ (third-party files, byte for byte as published)
VENDORED = frozenset({"js-yaml.esm.min.mjs"})
#: Nothing from another origin, nothing inline, no plugins, frames, base or form targets; the
#: API is reached with fetch on this origin only (connect-src), and DOM sinks that parse HTML
#: or script are refused (Trusted Types with no policy).
CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "manifest-src 'none'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
        "require-trusted-types-for 'script'",
        "trusted-types 'none'",
    )
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=(), payment=(), usb=()",
}
#: a week for assets: their URL carries a hash of their content
_ASSET_CACHE = "public, max-age=604800, immutable"


def static_dir() -> Path:
    return Path(str(files("service.console") / "static"))


def install_console(app: FastAPI) -> None:
    """Serve `/console` and its assets (read once here: they change only with the package)."""
    static = static_dir()
    page = Template((static / "index.html").read_text(encoding="utf-8"))
    paths = {
        name: static / "vendor" / name if name in VENDORED else static / name for name in ASSETS
    }
    digests = {
        name: hashlib.sha256(path.read_bytes()).hexdigest()[:16] for name, path in paths.items()
    }

    def render(root: str) -> str:
        def asset(name: str) -> str:
            return html.escape(f"{root}{ASSETS_PREFIX}/{name}?v={digests[name]}")

        return page.substitute(
            api=html.escape(f"{root}/v2/nvcf"),
            script=asset("console.js"),
            stylesheet=asset("console.css"),
            icon=asset("favicon.svg"),
        )

    @app.get(CONSOLE_PATH, include_in_schema=False)
    async def console(request: Request) -> HTMLResponse:
        body = render(str(request.scope.get("root_path", "")))
        return HTMLResponse(body, headers={**SECURITY_HEADERS, "Cache-Control": "no-store"})

    @app.get(ASSETS_PREFIX + "/{name}", include_in_schema=False)
    async def console_asset(name: str) -> FileResponse:
        media_type = ASSETS.get(name)
        if media_type is None:
            raise NotFound(detail=f"no console asset '{name}'")
        headers = {**SECURITY_HEADERS, "Cache-Control": _ASSET_CACHE}
        return FileResponse(paths[name], media_type=media_type, headers=headers)


__all__ = ["CONSOLE_PATH", "CONTENT_SECURITY_POLICY", "install_console"]
