"""The asset work of an invocation, behind the engine's one port (invocation/engine.py's
`AssetPort`): a request's input assets resolved at admission, its directories made before it
reaches the worker (here, or by the worker-utils sidecar in its pod), a large answer kept in
the object store, the progress of a detached request published for polls on other replicas
(docs/assets.md)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.assets.files import (
    OutputDirs,
    Progress,
    RequestFiles,
    TooManyOutputs,
    WorkerFiles,
)
from service.assets.models import Asset
from service.assets.results import ResultTooLarge, store_result
from service.assets.service import Assets
from service.assets.sidecar import SidecarFiles, SidecarRefused
from service.backends.worker import WorkerEndpoint, WorkerResponse
from service.clusters.adapters import AdapterRegistry
from service.core.errors import DomainError, ServiceUnavailable
from service.core.settings import Settings

log = logging.getLogger("nvcf.invocation")


class FilesRefused(Exception):
    """The request's files could not be made, or its large result not kept: the request
    ends with `status` and `reason`."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Kept:
    """A large answer, kept: answered with a 302 to `url`."""

    url: str


@dataclass(frozen=True, slots=True)
class Whole:
    """An answer of unknown length read for a detached request: not large after all."""

    body: bytes


class RequestAssets:
    """The engine's asset port; `assets` None: this process serves no assets (a request
    naming some is refused, none has directories or a large result)."""

    def __init__(
        self,
        settings: Settings,
        assets: Assets | None,
        adapters: AdapterRegistry,
        sessionmaker: async_sessionmaker[AsyncSession],
    ) -> None:
        self.assets = assets
        self.adapters = adapters
        self.sessionmaker = sessionmaker
        self.files_root = settings.asset_files_root
        #: output directories of workers on this machine, reused per instance
        self.output_dirs = OutputDirs(self.files_root / "output")
        self.result_max = settings.invoke_result_max_bytes
        self.max_references = settings.asset_max_references
        self.progress_period = settings.invoke_progress_period_seconds
        self._publishers: set[asyncio.Task[None]] = set()

    async def resolve(self, account_id: str, ids: Sequence[uuid.UUID], field: str) -> list[Asset]:
        """The referenced assets, each the account's, unexpired and uploaded (400 naming
        every one that is not)."""
        if self.assets is None:
            raise ServiceUnavailable(detail="assets are not served by this process")
        async with self.sessionmaker() as session, session.begin():
            return await self.assets.resolve(session, account_id, ids, field)

    async def prepare(
        self,
        request_id: uuid.UUID,
        inputs: Sequence[Asset],
        cluster: str,
        instance_key: str,
        endpoint: WorkerEndpoint,
        base_url: Callable[[], str] | None,
    ) -> WorkerFiles | None:
        """The request's asset and output directories: made here for a worker on this
        machine (a simulated cluster's), by the worker-utils sidecar in a Kubernetes pod
        (the signed URLs it needs sent along); none elsewhere."""
        adapter = self.adapters.get(cluster)
        assets = self.assets
        if assets is not None and getattr(adapter, "files_in_sidecar", False):
            base = _base(base_url)
            return await SidecarFiles.prepare(assets, request_id, inputs, endpoint, base, cluster)
        if assets is None or not getattr(adapter, "files_on_this_machine", False):
            if inputs:
                raise FilesRefused(
                    503,
                    f"input assets cannot be handed to workers of cluster {cluster} "
                    "yet (only to workers on the server's machine)",
                )
            return None
        try:
            folder = await self.output_dirs.take(instance_key)
            return await RequestFiles.prepare(
                assets.store,
                self.files_root,
                request_id,
                inputs,
                output_dir=folder,
                release=functools.partial(self.output_dirs.give_back, instance_key, folder),
            )
        except DomainError as exc:
            raise FilesRefused(503, exc.detail or exc.title) from None

    async def large(
        self,
        request_id: uuid.UUID,
        files: WorkerFiles,
        response: WorkerResponse,
        length: int | None,
        *,
        detached: bool,
        base_url: Callable[[], str] | None,
    ) -> Kept | Whole | None:
        """A large result (NVCF's rule): an answer body over NVCF-MAX-RESPONSE-SIZE-BYTES,
        or any file the worker wrote into NVCF-LARGE-OUTPUT-DIR, is kept in the object
        store (`Kept`); None when the answer is not large (errors never are). An answer of
        unknown length to a waiting caller is streamed as it comes (event streams); to a
        detached one it is read up to the limit first (`Whole` when it stayed under)."""
        assets = self.assets
        assert assets is not None
        if isinstance(files, SidecarFiles):  # the sidecar in the pod decided already
            try:
                stored = await files.result(assets, response, _base(base_url))
            except SidecarRefused as exc:
                await response.aclose()
                raise FilesRefused(exc.status, exc.detail) from None
            if stored is not None:
                await response.aclose()
                return Kept(stored)
        if response.status >= 400:
            return None
        settings = assets.settings
        try:
            outputs = await files.outputs(
                settings.asset_result_max_files, settings.asset_result_max_bytes
            )
        except TooManyOutputs as exc:
            await response.aclose()
            raise FilesRefused(502, f"the worker's large result was refused: {exc}") from None
        prefix = b""
        small = length is not None and length <= self.result_max
        if not outputs and (small or (length is None and not detached)):
            return None  # not large; a stream of unknown length flows to its waiting caller
        try:
            chunks = response.iter_bytes()
            if not outputs and length is None:
                parts: list[bytes] = []
                size = 0
                async for chunk in chunks:
                    parts.append(chunk)
                    size += len(chunk)
                    if size > self.result_max:
                        break
                prefix = b"".join(parts)
                if size <= self.result_max:
                    return Whole(prefix)

            async def body() -> AsyncIterator[bytes]:
                if prefix:
                    yield prefix
                async for chunk in chunks:
                    yield chunk

            url = await store_result(assets, request_id, body(), files, _base(base_url))
        except ResultTooLarge as exc:
            raise FilesRefused(502, f"the worker's large result was refused: {exc}") from None
        finally:
            await response.aclose()
        return Kept(url)

    def publish(
        self,
        request_id: uuid.UUID,
        done: asyncio.Event,
        files: Callable[[], WorkerFiles | None],
        save: Callable[[uuid.UUID, Progress], Awaitable[None]],
    ) -> None:
        """Until `done`, every NVCF_INVOKE_PROGRESS_PERIOD_SECONDS: the detached request's
        progress report (`files()`, once it has its directories), `save`d whenever it
        changed, so that a poll reaching another replica shows it too (polls reaching this
        one read the report directly)."""
        if self.assets is None or self.progress_period <= 0:
            return
        task = asyncio.get_running_loop().create_task(self._publish(request_id, done, files, save))
        self._publishers.add(task)
        task.add_done_callback(self._publishers.discard)

    async def _publish(
        self,
        request_id: uuid.UUID,
        done: asyncio.Event,
        files: Callable[[], WorkerFiles | None],
        save: Callable[[uuid.UUID, Progress], Awaitable[None]],
    ) -> None:
        last: Progress | None = None
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.progress_period):
                    await done.wait()
            current = files()
            if done.is_set() or current is None:
                continue
            progress = await current.progress()
            if progress is None or progress == last:
                continue
            try:
                await save(request_id, progress)
                last = progress
            except Exception as exc:  # the next change tries again; polls here still see it
                log.warning("storing the progress of request %s failed: %r", request_id, exc)

    async def aclose(self) -> None:
        await self.output_dirs.aclose()


def _base(base_url: Callable[[], str] | None) -> str:
    """The caller's base URL, asked only when a signed URL needs it."""
    return base_url() if base_url is not None else ""
