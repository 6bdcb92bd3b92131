"""The version read speed-ups, in one place, behind one setting (`NVCF_VERSION_READ_CACHE`).

Clients poll `GET .../functions/{id}/versions/{versionId}` while a version deploys. Three
layers answer it without redoing the work, each falling back to the next:

1. `VersionReadFastPath`, an ASGI middleware before FastAPI: when the caller's API key was
   verified moments ago and the serialised version is cached, the bytes go straight out.
   Anything else (no cache entry, a JWT, an unknown, expired or revoked key, a missing scope,
   an org alias naming another account) falls through to the route.
2. The route (`cached_version_read`): the same cache after the regular authentication.
3. The database.

Lists of versions (`GET /functions`, `GET /functions/{id}/versions`) are kept the same way by
their routes (`cached_list_read`), keyed by the route's parameters; any version change drops
every list.

Every such response says which layer answered in the `NVCF-Read-Path` header (`fast-path`,
`cache` or `database`). The cache holds serialised responses per (reading account, version,
details scope, secret names or not); entries are dropped when a committed transaction changes
the version (service.core.changes), its details entries when one of its deployments or their
instances changes (they embed activeInstances; the cache learns which version a deployment
belongs to from the deployment rows the feed reports, and drops every details entry for an
instance of a deployment it has not seen or a bulk statement naming no rows), and everything
when what is shared with whom changes. Writes of the reconciler's bookkeeping (leases, due
times) drop nothing, so a version stays cached while the rest of the fleet converges.
A read with a query string (`includeSecrets`) skips the fast path. It is on only with SQLite,
the single-process embedded mode: several replicas on PostgreSQL would not see each other's
commits. A short TTL bounds staleness from writes the listeners cannot see (raw SQL).
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Awaitable, Callable, Collection
from types import SimpleNamespace
from typing import Any

from cachetools import LRUCache, TTLCache
from sqlalchemy import inspect
from starlette.requests import HTTPConnection
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from service.auth import scopes
from service.auth.caller import caller
from service.auth.deps import AUTHENTICATOR
from service.auth.scopes import LIST_FUNCTIONS_DETAILS
from service.auth.service import Principal
from service.core import changes as change_feed
from service.core.components import Component
from service.core.deps import RATE_LIMITER
from service.core.errors import DomainError, NotFound
from service.core.settings import Settings
from service.functions.models import FunctionAuthorization, FunctionVersion

HEADER = "NVCF-Read-Path"
_JSON = "application/json"

#: account, function, version, details scope, secret names included
CacheKey = tuple[str, uuid.UUID, uuid.UUID, bool, bool]
#: deployments whose version the cache remembers; versions whose last drop it remembers
MAX_TRACKED = 100_000


def cache_key(
    account_id: str,
    caller_scopes: Collection[str],
    function_id: uuid.UUID,
    version_id: uuid.UUID,
    secrets: bool = True,
) -> CacheKey:
    """The key of one version's body as one caller sees it (the details scope changes it)."""
    return (account_id, function_id, version_id, LIST_FUNCTIONS_DETAILS in caller_scopes, secrets)


#: a list's key: account, details scope, then the route and its parameters
ListKey = tuple[Any, ...]


class VersionCache:
    """Serialised version bodies, and serialised lists of versions: LRU caches whose entries
    expire after `ttl` seconds (a safety net; commits invalidate them through the change feed)."""

    def __init__(self, max_entries: int = 10_000, ttl: float = 5.0) -> None:
        # version id -> {key: body}: the variants of one version expire and go together
        self._data: TTLCache[uuid.UUID, dict[CacheKey, bytes]] = TTLCache(
            max_entries, ttl, timer=time.monotonic
        )
        # list key -> body; a list is dropped when any version changes
        self._lists: TTLCache[ListKey, bytes] = TTLCache(max_entries, ttl, timer=time.monotonic)
        self._generation = 0
        #: the generation at which entries were last dropped: all, every details entry, a
        #: version's (a reader keeps what it built only if none of its entry's dropped since)
        self._all_dropped = 0
        self._details_dropped = 0
        self._version_dropped: dict[uuid.UUID, int] = {}
        #: deployment id -> version id, learned from the deployment rows the feed reports
        self._deployments: LRUCache[Any, Any] = LRUCache(MAX_TRACKED)

    @property
    def generation(self) -> int:
        """Bumped by every invalidation: a reader stores only if nothing changed meanwhile."""
        return self._generation

    def get(self, key: CacheKey) -> bytes | None:
        entries = self._data.get(key[2])
        return entries.get(key) if entries else None

    def put(self, key: CacheKey, body: bytes, generation: int) -> None:
        version_id, details = key[2], key[3]
        dropped = max(
            self._all_dropped,
            self._details_dropped if details else 0,
            self._version_dropped.get(version_id, 0),
        )
        if dropped > generation:
            return  # its entry changed while this response was being built
        entries = self._data.get(version_id)
        if entries is None:
            self._data[version_id] = entries = {}
        entries[key] = body

    def get_list(self, key: ListKey) -> bytes | None:
        return self._lists.get(key)

    def put_list(self, key: ListKey, body: bytes, generation: int) -> None:
        if generation != self._generation:
            return
        self._lists[key] = body

    def changed(self, changes: dict[str, set[Any] | None]) -> None:
        self._generation += 1
        if "function_authorization" in changes:
            # who may read what changed: which entries that touches is not tracked
            self._drop_all()
            return
        if "function_version" in changes:
            # which lists hold a version is not tracked: any version change drops them all
            self._lists.clear()
        versions = changes.get("function_version", set())
        if versions is None:  # a bulk statement: rows unknown
            self._drop_all()
            return
        details = self._details_of(changes)
        if details is None or details:
            for list_key in [k for k in self._lists if k[1]]:
                del self._lists[list_key]
        if details is None:
            self._details_dropped = self._generation
            for entries in self._data.values():
                for key in [k for k in entries if k[3]]:
                    del entries[key]
        else:
            for version_id in details:
                kept = self._data.get(version_id) or {}
                for key in [k for k in kept if k[3]]:
                    del kept[key]
                self._dropped(version_id)
        for version_id in versions:
            self._data.pop(version_id, None)
            self._dropped(version_id)

    def _details_of(self, changes: dict[str, set[Any] | None]) -> set[Any] | None:
        """The versions whose activeInstances the changes touch; None when unknown."""
        deployments = changes.get("deployment", set())
        instances = changes.get("instance", set())
        if deployments is None or instances is None:
            return None
        out: set[Any] = set()
        for deployment_id, version_id in deployments:
            if version_id is None:
                return None
            self._deployments[deployment_id] = version_id
            out.add(version_id)
        for deployment_id in instances:
            version_id = self._deployments.get(deployment_id)
            if version_id is None:
                return None
            out.add(version_id)
        return out

    def _dropped(self, version_id: uuid.UUID) -> None:
        if len(self._version_dropped) >= MAX_TRACKED:
            self._version_dropped.clear()
            self._all_dropped = self._generation
        self._version_dropped[version_id] = self._generation

    def _drop_all(self) -> None:
        self._lists.clear()
        self._data.clear()
        self._version_dropped.clear()
        self._all_dropped = self._generation


VERSION_CACHE = Component[VersionCache | None]("version_cache")


def _loaded(row: Any, name: str) -> Any:
    """A column of a changed row as loaded, never loading it (None when it is not)."""
    return inspect(row).dict.get(name)


def attach(cache: VersionCache, *, deployment: type[Any], instance: type[Any]) -> None:
    """Invalidate `cache` on every commit that touches the rows its entries are built from:
    the registry's, and the tables activeInstances are read from, which the registry does not
    own (the composition names them): `deployment` rows (`id`, `version_id`) and `instance`
    rows (`deployment_id`).

    Called explicitly at application start: registering the watches as a side effect of
    importing a module left them out whenever that module was not imported (e.g. when no
    migration ran at start), and edits then stayed invisible for the TTL.
    """
    change_feed.watch(FunctionVersion, "function_version")
    change_feed.watch(
        deployment, "deployment", key=lambda row: (row.id, _loaded(row, "version_id"))
    )
    change_feed.watch(instance, "instance", key=lambda row: _loaded(row, "deployment_id"))
    change_feed.watch(FunctionAuthorization, "function_authorization")
    change_feed.subscribe(cache)


_PATH = re.compile(
    r"^/v2/nvcf/functions/(?P<fid>[0-9a-fA-F-]{36})/versions/(?P<vid>[0-9a-fA-F-]{36})$"
)
ROUTE = SimpleNamespace(path="/v2/nvcf/functions/{functionId}/versions/{functionVersionId}")
_LIST_SCOPES = frozenset(scopes.LIST_SCOPES)


class VersionReadFastPath:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "GET" or scope.get("query_string"):
            await self.app(scope, receive, send)
            return
        body = await self._cached_body(scope)
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
                    (HEADER.lower().encode(), b"fast-path"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def _cached_body(self, scope: Scope) -> bytes | None:
        match = _PATH.match(scope["path"])
        if match is None:
            return None
        if "app" not in scope:
            return None
        connection = HTTPConnection(scope)
        cache = VERSION_CACHE.of(connection)
        if cache is None:
            return None
        authorization = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value.decode("latin-1")
                break
        request_state = scope.setdefault("state", {})
        try:
            principal = await caller(
                AUTHENTICATOR.of(connection),
                authorization,
                sessions=None,  # a key verified moments ago, or the route
                any_of=_LIST_SCOPES,
                org=request_state.get("org"),
                # a refusal: the route answers it, uncounted
                limiter=RATE_LIMITER.of(connection),
                state=request_state,
                reach=_unlimited,
            )
            fid, vid = uuid.UUID(match["fid"]), uuid.UUID(match["vid"])
        except (DomainError, ValueError):
            return None
        return cache.get(cache_key(principal.account_id, principal.scopes, fid, vid))


async def _unlimited(principal: Principal) -> None:
    """A key limited to named functions goes to the route, which checks which."""
    if principal.functions is not None:
        raise NotFound(detail="the route checks a key limited to named functions")


def enabled(settings: Settings) -> bool:
    """The cache is on when the setting allows it and the database is SQLite (one process)."""
    return settings.version_read_cache and settings.effective_database_url.startswith("sqlite")


async def cached_version_read(
    cache: VersionCache | None,
    principal: Principal,
    function_id: uuid.UUID,
    version_id: uuid.UUID,
    build: Callable[[], Awaitable[str]],
    *,
    secrets: bool = True,
) -> Response:
    """The route's read of one version: from the cache, or `build()` (which reads the database)
    then kept for the next reader unless something changed meanwhile."""
    key = cache_key(principal.account_id, principal.scopes, function_id, version_id, secrets)
    if cache is not None and (cached := cache.get(key)) is not None:
        return Response(cached, media_type=_JSON, headers={HEADER: "cache"})
    generation = cache.generation if cache is not None else 0
    body = await build()
    if cache is not None:
        cache.put(key, body.encode(), generation)
    return Response(body, media_type=_JSON, headers={HEADER: "database"})


async def cached_list_read(
    cache: VersionCache | None,
    principal: Principal,
    route_key: tuple[Any, ...],
    build: Callable[[], Awaitable[str]],
) -> Response:
    """A list of versions (`route_key`: the route and its parameters) from the cache, or
    `build()` then kept; the caller's details scope is part of the key."""
    only = tuple(sorted(map(str, principal.functions))) if principal.functions is not None else None
    key = (principal.account_id, LIST_FUNCTIONS_DETAILS in principal.scopes, only, *route_key)
    if cache is not None and (cached := cache.get_list(key)) is not None:
        return Response(cached, media_type=_JSON, headers={HEADER: "cache"})
    generation = cache.generation if cache is not None else 0
    body = await build()
    if cache is not None:
        cache.put_list(key, body.encode(), generation)
    return Response(body, media_type=_JSON, headers={HEADER: "database"})
