"""`/docs` (Swagger UI) and `/redoc` from files installed with the package, so both work offline.

FastAPI's own pages load Swagger UI, ReDoc, a favicon and Google Fonts from public hosts: on
a machine without internet access they stay blank. The scripts and the stylesheet come from
the `fastapi-offline` package (which vendors swagger-ui-dist and the ReDoc standalone
bundle); they are served by name from a fixed list, never as a directory.
"""

from __future__ import annotations

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
        return get_swagger_ui_html(
            openapi_url=openapi_url(request),
            title=f"{app.title} - Swagger UI",
            swagger_js_url=asset(request, "swagger-ui-bundle.js"),
            swagger_css_url=asset(request, "swagger-ui.css"),
            swagger_favicon_url=asset(request, "favicon.png"),
            oauth2_redirect_url=None,
            swagger_ui_parameters=app.swagger_ui_parameters,
        )

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi_url(request),
            title=f"{app.title} - ReDoc",
            redoc_js_url=asset(request, "redoc.standalone.js"),
            redoc_favicon_url=asset(request, "favicon.png"),
            with_google_fonts=False,
        )

    @app.get(ASSETS_PREFIX + "/{name}", include_in_schema=False)
    async def docs_asset(name: str) -> FileResponse:
        media_type = ASSETS.get(name)
        if media_type is None:
            raise NotFound(detail=f"no documentation asset '{name}'")
        return FileResponse(static / name, media_type=media_type, headers={"Cache-Control": _CACHE})
