"""A per-process cache of serialised version responses, for clients that poll a version.

Entries are dropped when a committed transaction changes the version (service.core.changes),
and all details entries when any deployment or instance changes (they embed activeInstances).
Only used with SQLite, the single-process embedded mode; several replicas on PostgreSQL would
not see each other's commits. A short TTL bounds staleness from writes the listeners cannot
see (raw SQL).
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from collections.abc import Collection
from typing import Any

from service.auth.scopes import LIST_FUNCTIONS_DETAILS
from service.core import changes as change_feed
from service.deployments.models import Deployment, Instance
from service.functions.models import FunctionVersion

CacheKey = tuple[str, uuid.UUID, uuid.UUID, bool]  # account, function, version, details


def cache_key(
    account_id: str, caller_scopes: Collection[str], function_id: uuid.UUID, version_id: uuid.UUID
) -> CacheKey:
    """The key of one version's body as one caller sees it (the details scope changes it)."""
    return (account_id, function_id, version_id, LIST_FUNCTIONS_DETAILS in caller_scopes)


class VersionCache:
    def __init__(self, max_entries: int = 10_000, ttl: float = 5.0) -> None:
        # version id -> {key: (expiry, body)}; ordered by insertion for eviction
        self._data: OrderedDict[uuid.UUID, dict[CacheKey, tuple[float, bytes]]] = OrderedDict()
        self._max = max_entries
        self._ttl = ttl
        self._generation = 0

    @property
    def generation(self) -> int:
        """Bumped by every invalidation: a reader stores only if nothing changed meanwhile."""
        return self._generation

    def get(self, key: CacheKey) -> bytes | None:
        entries = self._data.get(key[2])
        hit = entries.get(key) if entries else None
        if hit is None:
            return None
        if hit[0] < time.monotonic():
            del entries[key]  # type: ignore[union-attr]
            return None
        return hit[1]

    def put(self, key: CacheKey, body: bytes, generation: int) -> None:
        if generation != self._generation:
            return  # something changed while this response was being built
        self._data.setdefault(key[2], {})[key] = (time.monotonic() + self._ttl, body)
        self._data.move_to_end(key[2])
        while len(self._data) > self._max:
            self._data.popitem(last=False)

    def changed(self, changes: dict[str, set[Any] | None]) -> None:
        self._generation += 1
        versions = changes.get("function_version", set())
        if versions is None:  # a bulk statement: rows unknown
            self._data.clear()
            return
        if "instance" in changes or "deployment" in changes:
            for entries in self._data.values():
                for key in [k for k in entries if k[3]]:
                    del entries[key]
        for version_id in versions:
            self._data.pop(version_id, None)


def attach(cache: VersionCache) -> None:
    """Invalidate `cache` on every commit that touches the rows its entries are built from.

    Called explicitly at application start: registering the watches as a side effect of
    importing a module left them out whenever that module was not imported (e.g. when no
    migration ran at start), and edits then stayed invisible for the TTL.
    """
    change_feed.watch(FunctionVersion, "function_version")
    change_feed.watch(Deployment, "deployment")
    change_feed.watch(Instance, "instance")
    change_feed.subscribe(cache)
