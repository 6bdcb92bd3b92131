"""The Kubernetes adapter's change feed (backends/changes.py): one LIST+WATCH per observed kind
(pods, their controllers, warning events) across all namespaces, marking the instance whose
namespace (`sr-<instanceId>`) an object belongs to.

Each watch starts from the resourceVersion of a one-item LIST and follows the stream (lightkube
resumes a stream the server ended cleanly from the last version seen). When a watch fails —
a lost connection, 410 Gone after compaction, an API server down — it is re-established after a
back-off. Once every watch of the cluster is established again the whole cluster is marked for
one resync: changes made meanwhile were not seen. The first establishment counts too (changes
between the reconciler's start-up resync and the watches were not seen either).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lightkube import ALL_NS, AsyncClient
from lightkube.generic_resource import GenericNamespacedResource

from service.backends.changes import ChangeLog

log = logging.getLogger("nvcf.backends.kubernetes")

#: seconds the API server keeps one watch request open (lightkube re-issues it)
SERVER_TIMEOUT = 300


@dataclass(frozen=True)
class Watched:
    """One watched kind: its resource class and an optional field selector."""

    resource: type[GenericNamespacedResource]
    fields: tuple[tuple[str, str], ...] = ()

    @property
    def selector(self) -> dict[str, Any] | None:
        return dict(self.fields) or None


class ClusterWatch:
    """The watches of one cluster; `start()` on the event loop, `aclose()` to stop."""

    def __init__(
        self,
        cluster: str,
        client: Callable[[], AsyncClient],
        watched: Sequence[Watched],
        changes: ChangeLog,
        *,
        backoff: tuple[float, float] = (0.5, 30.0),
    ) -> None:
        self.cluster = cluster
        self._client = client
        self._watched = tuple(watched)
        self._changes = changes
        self._backoff = backoff
        self._tasks: list[asyncio.Task[None]] = []
        #: the watches not established (since start or a failure): a resync once none is left
        self._down = set(range(len(self._watched)))
        #: watch establishments so far, and resyncs asked for
        self.established = 0
        self.resyncs = 0

    @property
    def running(self) -> bool:
        return bool(self._tasks)

    def start(self) -> None:
        if not self._tasks:
            self._tasks = [
                asyncio.create_task(
                    self._run(i, w), name=f"nvcf-watch-{self.cluster}-{w.resource.__name__}"
                )
                for i, w in enumerate(self._watched)
            ]

    async def aclose(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _up(self, index: int) -> None:
        self.established += 1
        if index in self._down:
            self._down.discard(index)
            if not self._down:
                self.resyncs += 1
                self._changes.mark_resync()

    async def _run(self, index: int, watched: Watched) -> None:
        failures = 0
        while True:
            try:
                client = self._client()
                version = await self._current_version(client, watched)
                self._up(index)
                stream = client.watch(
                    watched.resource,
                    namespace=ALL_NS,
                    fields=watched.selector,
                    resource_version=version,
                    server_timeout=SERVER_TIMEOUT,
                )
                # The back-off is reset only once the WATCH itself has worked (its first event,
                # or its clean end at the server's timeout): a LIST that works while the WATCH
                # keeps failing (no `watch` permission, a proxy cutting long requests) backs
                # off to its longest delay instead of asking for a resync every half second.
                async for _, obj in stream:
                    failures = 0
                    namespace = obj.metadata.namespace if obj.metadata is not None else None
                    if namespace:
                        self._changes.mark_namespace(namespace)
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure of a background watch: back off and retry
                self._down.add(index)
                failures += 1
                delay = min(self._backoff[0] * 2 ** (failures - 1), self._backoff[1])
                log.warning(
                    "cluster %s: watching %s failed (%s); re-establishing in %.1fs",
                    self.cluster,
                    watched.resource.__name__,
                    exc,
                    delay,
                )
                await asyncio.sleep(delay)

    @staticmethod
    async def _current_version(client: AsyncClient, watched: Watched) -> str:
        """The collection's resourceVersion, read with a one-item LIST."""
        listing = client.list(
            watched.resource, namespace=ALL_NS, chunk_size=1, fields=watched.selector
        )
        items = aiter(listing)
        try:
            await anext(items, None)
        finally:
            if isinstance(items, AsyncGenerator):
                await items.aclose()
        return listing.resourceVersion
