"""Per-request directories of a worker that runs on this machine (the simulated clusters):
`<root>/assets/<requestId>` holds one file per input asset, named by its id, before the
request reaches the worker (`NVCF-ASSET-DIR`; made only when there are assets, as NVCF's
worker utilities do); `<root>/output/<requestId>` is where it may
write large outputs and its `progress` file (`NVCF-LARGE-OUTPUT-DIR`). Both are removed after
the request. Layout and headers as NVCF's worker utilities make them (docs/assets.md).

Only regular files count: a symbolic link a worker leaves is never followed, so a worker
cannot make the server read (and hand out) a file outside its directories.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import shutil
import stat
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Protocol

import anyio

from service.assets.models import Asset
from service.assets.storage import MissingObject, ObjectStore
from service.core.errors import FieldError, ServiceUnavailable, ValidationFailed
from service.core.http import NotJson, RefusedJson, load_json

log = logging.getLogger("nvcf.assets")

PROGRESS_FILE = "progress"
#: bytes of a progress file read at most (NVCF's partial responses are small JSON objects)
PROGRESS_MAX_BYTES = 64 * 1024
#: the invocation header naming input assets (NVCF's; service.py says it too)
REFERENCES_HEADER = "NVCF-INPUT-ASSET-REFERENCES"
#: assets fetched at once for one request
FETCH_CONCURRENCY = 4


@dataclass(frozen=True, slots=True)
class Progress:
    """A worker's progress report: `percent` (0-100) and its partial output (JSON text)."""

    percent: int
    partial: bytes


@dataclass(frozen=True, slots=True)
class Output:
    """A regular file the worker wrote: its path and its name relative to the directory."""

    path: Path
    name: str
    size: int


#: writes one asset's bytes into a new file (`RequestFiles.fetched`)
Fetch = Callable[[uuid.UUID, Path], Awaitable[None]]


class TooManyOutputs(Exception):
    """The worker wrote more files or bytes than a large result may hold."""


def _is_empty(folder: Path) -> bool:
    """Whether the directory has no entry (one read of a small local directory)."""
    try:
        with os.scandir(folder) as entries:
            return next(entries, None) is None
    except FileNotFoundError:
        return False


def _make_all(folders: Sequence[Path], mode: int) -> None:
    for folder in folders:
        _make(folder, mode)


def _make(folder: Path, mode: int = 0o700) -> None:
    try:
        folder.mkdir(mode=mode)
    except FileNotFoundError:  # the first one under its parent
        folder.parent.mkdir(mode=mode, parents=True, exist_ok=True)
        folder.mkdir(mode=mode)


class OutputDirs:
    """Output directories for the requests of one process, kept for reuse per instance:
    making and removing a directory for every request costs more than the rest of an
    invocation. A request takes a free empty directory of its instance's (or a new one); when
    it ends the directory goes back if it is still empty, and is removed otherwise (the
    worker wrote outputs or progress). Directories are never shared between instances, so
    never between functions or accounts; the process's own random folder keeps another
    process (or an earlier run) out of them."""

    def __init__(self, root: Path) -> None:
        self.root = root / uuid.uuid4().hex
        self._free: dict[str, list[Path]] = {}
        self._made = 0
        #: the process's lock on its folder, held while it lives (`sweep` reads it)
        self._lock: int | None = None
        self._claiming = asyncio.Lock()

    async def take(self, instance: str) -> Path:
        free = self._free.get(instance)
        if free:
            return free.pop()
        self._made += 1
        folder = self.root / instance / str(self._made)
        if self._lock is None:
            async with self._claiming:  # requests arriving together: one claim
                if self._lock is None:
                    self._lock = await anyio.to_thread.run_sync(_claim, self.root)
        await anyio.to_thread.run_sync(_make, folder)
        return folder

    async def give_back(self, instance: str, folder: Path) -> None:
        # a small local directory's first entry, read here: a thread hop costs more
        if _is_empty(folder):
            self._free.setdefault(instance, []).append(folder)
        else:
            await anyio.to_thread.run_sync(shutil.rmtree, folder, True)

    async def aclose(self) -> None:
        self._free.clear()
        await anyio.to_thread.run_sync(shutil.rmtree, self.root, True)
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


LOCK_FILE = ".lock"


def _claim(folder: Path) -> int:
    """Make the process's folder and hold an exclusive lock on its lock file (released by
    the system when the process ends, however it ends)."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def _abandoned(folder: Path, cutoff: float) -> bool:
    """Whether a process folder's process is gone: nobody holds its lock (or it has none and
    is older than `cutoff`, a wall-clock time)."""
    try:
        fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_NOFOLLOW)
    except FileNotFoundError:
        return folder.lstat().st_mtime < cutoff
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def sweep(root: Path, max_age: float) -> int:
    """Remove what crashed processes left under the files root: output folders of processes
    that no longer hold their lock, and asset directories and result spools older than
    `max_age` seconds (no request lives that long). How many entries went."""
    cutoff = time.time() - max_age
    removed = 0
    for sub in ("assets", "output", "results"):
        try:
            entries = list(os.scandir(root / sub))
        except FileNotFoundError:
            continue
        for entry in entries:
            path = Path(entry.path)
            try:
                if sub == "output" and entry.is_dir(follow_symlinks=False):
                    gone = _abandoned(path, cutoff)
                else:
                    gone = entry.stat(follow_symlinks=False).st_mtime < cutoff
            except FileNotFoundError:
                continue
            if not gone:
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            removed += 1
    return removed


class WorkerFiles(Protocol):
    """A request's files as the engine sees them: made here (`RequestFiles`, a worker on this
    machine) or by the worker-utils sidecar in the worker's pod (sidecar.py)."""

    @property
    def request_id(self) -> uuid.UUID: ...

    @property
    def asset_ids(self) -> tuple[uuid.UUID, ...]: ...

    def worker_headers(self) -> list[tuple[str, str]]: ...

    async def remove(self) -> None: ...

    async def outputs(self, max_files: int, max_bytes: int) -> list[Output]: ...

    async def progress(self) -> Progress | None: ...


@dataclass(frozen=True)
class RequestFiles:
    request_id: uuid.UUID
    #: the asset directory's path (made only when there are assets)
    asset_path: str
    output_dir: Path
    asset_ids: tuple[uuid.UUID, ...]
    #: gives the output directory back for reuse (OutputDirs); None: it is removed
    release: Callable[[], Awaitable[None]] | None = None

    @cached_property
    def asset_dir(self) -> Path:
        return Path(self.asset_path)

    @classmethod
    async def prepare(
        cls,
        store: ObjectStore,
        root: Path,
        request_id: uuid.UUID,
        assets: Sequence[Asset],
        *,
        output_dir: Path | None = None,
        release: Callable[[], Awaitable[None]] | None = None,
    ) -> RequestFiles:
        """Make the directories (`output_dir`: one already made, given back by `release`)
        and copy every asset out of the store into the asset directory; on any failure
        nothing is left behind: an asset deleted since it was resolved is a 400 naming it, a
        store failure a 503."""
        keys = {a.id: a.key for a in assets}

        async def fetch(asset_id: uuid.UUID, dest: Path) -> None:
            await store.fetch(keys[asset_id], dest)

        return await cls.fetched(
            fetch, root, request_id, list(keys), output_dir=output_dir, release=release
        )

    @classmethod
    async def fetched(
        cls,
        fetch: Fetch,
        root: Path,
        request_id: uuid.UUID,
        asset_ids: Sequence[uuid.UUID],
        *,
        output_dir: Path | None = None,
        release: Callable[[], Awaitable[None]] | None = None,
        mode: int = 0o700,
    ) -> RequestFiles:
        """`prepare` with any way of getting an asset's bytes: `fetch(assetId, dest)` writes
        the file `dest` (a new one) or raises `MissingObject` (the store here, a signed URL
        in the worker-utils sidecar: worker_utils.py). `mode`: of the directories made."""
        rid = str(request_id)
        files = cls(
            request_id,
            f"{root}/assets/{rid}",
            output_dir or root / "output" / rid,
            tuple(asset_ids),
            release,
        )
        # the asset directory only when there are assets (as NVCF's worker utilities)
        todo = [files.asset_dir] if asset_ids else []
        if output_dir is None:
            todo.append(files.output_dir)
        if not todo:
            return files
        try:
            await anyio.to_thread.run_sync(_make_all, todo, mode)
            if asset_ids:
                await files._fetch_all(fetch)
        except BaseException:
            await files.remove()
            raise
        return files

    async def _fetch_all(self, fetch: Fetch) -> None:
        """Every asset into the asset directory, a few at once: a 400 naming each one deleted
        meanwhile, a 503 when the store fails (the caller removes what was made)."""
        missing: list[FieldError] = []
        failed: list[str] = []
        gate = asyncio.Semaphore(FETCH_CONCURRENCY)

        async def one(asset_id: uuid.UUID) -> None:
            async with gate:
                try:
                    await fetch(asset_id, self.asset_dir / str(asset_id))
                except MissingObject:
                    missing.append(
                        FieldError(
                            REFERENCES_HEADER, f"asset {asset_id} was deleted before the request"
                        )
                    )
                except Exception as exc:
                    log.warning("fetching asset %s failed: %r", asset_id, exc)
                    failed.append(str(asset_id))

        async with asyncio.TaskGroup() as group:
            for asset_id in self.asset_ids:
                group.create_task(one(asset_id))
        if missing:
            raise ValidationFailed.of(missing, what="asset references")
        if failed:
            raise ServiceUnavailable(
                detail=f"the object store failed to hand out asset(s) {', '.join(failed)}; "
                "try again"
            )

    def worker_headers(self) -> list[tuple[str, str]]:
        """The headers that tell the worker where its files are (NVCF's names)."""
        headers = [
            ("NVCF-ASSET-DIR", self.asset_path),
            ("NVCF-LARGE-OUTPUT-DIR", str(self.output_dir)),
        ]
        if self.asset_ids:
            headers.append(("NVCF-FUNCTION-ASSET-IDS", ",".join(map(str, self.asset_ids))))
        return headers

    async def remove(self) -> None:
        """The request is over: its asset directory removed, its output directory given
        back (or removed)."""
        folders = [self.asset_dir] if self.asset_ids else []
        if self.release is None:
            folders.append(self.output_dir)
        if folders:
            await anyio.to_thread.run_sync(_remove, folders)
        if self.release is not None:
            await self.release()

    async def outputs(self, max_files: int, max_bytes: int) -> list[Output]:
        """The regular files the worker wrote (all but `progress`), sorted by name; raises
        TooManyOutputs past either bound."""
        if _is_empty(self.output_dir):  # as it mostly is: no thread hop for that
            return []
        return await anyio.to_thread.run_sync(scan_outputs, self.output_dir, max_files, max_bytes)

    async def progress(self) -> Progress | None:
        return await anyio.to_thread.run_sync(read_progress, self.output_dir, self.request_id)


def _remove(folders: Sequence[Path]) -> None:
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def scan_outputs(folder: Path, max_files: int, max_bytes: int) -> list[Output]:
    found: list[Output] = []
    total = 0
    for top, _dirs, names in os.walk(folder, followlinks=False):
        for name in names:
            if name == PROGRESS_FILE:
                continue
            path = Path(top) / name
            try:
                info = path.lstat()
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(info.st_mode):
                continue
            total += info.st_size
            found.append(Output(path, path.relative_to(folder).as_posix(), info.st_size))
            if len(found) > max_files:
                raise TooManyOutputs(
                    f"the worker wrote more than {max_files} files into NVCF-LARGE-OUTPUT-DIR "
                    "(NVCF_ASSET_RESULT_MAX_FILES)"
                )
            if total > max_bytes:
                raise TooManyOutputs(
                    f"the worker's outputs pass {max_bytes} bytes (NVCF_ASSET_RESULT_MAX_BYTES)"
                )
    found.sort(key=lambda o: o.name)
    return found


def read_progress(folder: Path, request_id: uuid.UUID) -> Progress | None:
    """The worker's `progress` file as NVCF's worker utilities read it: JSON
    `{"id": requestId, "progress": percent, "partialResponse": {...}}`. None when there is
    none, or it is unreadable, too large, of another request or malformed (a worker may be
    half-way through writing it: the next poll reads it again)."""
    raw = progress_bytes(folder)
    return None if raw is None else parse_progress(raw, request_id)


def progress_bytes(folder: Path) -> bytes | None:
    """The `progress` file's bytes (at most one past PROGRESS_MAX_BYTES), never through a
    link; None when there is no regular file."""
    try:
        fd = os.open(folder / PROGRESS_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with contextlib.closing(os.fdopen(fd, "rb")) as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return fh.read(PROGRESS_MAX_BYTES + 1)


def parse_progress(raw: bytes, request_id: uuid.UUID) -> Progress | None:
    """A progress report in NVCF's format (the file's bytes, or the worker-utils sidecar's
    answer, which passes the file on as it is); None when it is not one of this request."""
    if len(raw) > PROGRESS_MAX_BYTES:
        return None
    try:
        data = load_json(raw)
    except (NotJson, RefusedJson):
        return None
    if not isinstance(data, dict) or str(data.get("id", "")).lower() != str(request_id):
        return None
    percent = data.get("progress")
    if not isinstance(percent, int) or isinstance(percent, bool) or not 0 <= percent <= 100:
        return None
    partial = data.get("partialResponse")
    return Progress(percent, json.dumps(partial, separators=(",", ":")).encode())
