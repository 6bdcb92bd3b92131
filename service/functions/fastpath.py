"""Answer `GET .../functions/{id}/versions/{versionId}` from the version cache before FastAPI.

Clients poll a version while it deploys; when the caller's API key was verified moments ago
and the serialised version is cached, the bytes go straight out. Anything else (no cache
entry, a JWT, an unknown, expired or revoked key, a missing scope, an org alias naming
another account) falls through to the regular route, which gives the proper answer. The
outer middleware still assigns the request id, counts and logs the request.
"""

from __future__ import annotations

import re
import uuid
from types import SimpleNamespace

from starlette.types import ASGIApp, Receive, Scope, Send

from service.auth import scopes
from service.auth.service import Authenticator
from service.functions.cache import VersionCache, cache_key

_PATH = re.compile(
    r"^/v2/nvcf/functions/(?P<fid>[0-9a-fA-F-]{36})/versions/(?P<vid>[0-9a-fA-F-]{36})$"
)
ROUTE = SimpleNamespace(path="/v2/nvcf/functions/{functionId}/versions/{functionVersionId}")
_LIST_SCOPES = frozenset(scopes.LIST_SCOPES)


class VersionReadFastPath:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "GET":
            await self.app(scope, receive, send)
            return
        body = self._cached_body(scope)
        if body is None:
            await self.app(scope, receive, send)
            return
        scope["route"] = ROUTE
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-length", str(len(body)).encode()),
                    (b"content-type", b"application/json"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def _cached_body(self, scope: Scope) -> bytes | None:
        match = _PATH.match(scope["path"])
        if match is None:
            return None
        app_state = scope["app"].state if "app" in scope else None
        cache: VersionCache | None = getattr(app_state, "version_cache", None)
        auth: Authenticator | None = getattr(app_state, "authenticator", None)
        if cache is None or auth is None:
            return None
        authorization = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value.decode("latin-1")
                break
        principal = auth.cached_principal(authorization)
        if principal is None or principal.scopes.isdisjoint(_LIST_SCOPES):
            return None
        org = scope.get("state", {}).get("org")
        if org is not None and org != principal.account_id:
            return None
        try:
            fid, vid = uuid.UUID(match["fid"]), uuid.UUID(match["vid"])
        except ValueError:
            return None
        body = cache.get(cache_key(principal.account_id, principal.scopes, fid, vid))
        if body is not None:
            scope.setdefault("state", {})["account_id"] = principal.account_id
        return body
