"""`nvcf-server worker-utils --task-results-dir ...`: the worker-utils sidecar in a task's pod
(docs/kubernetes.md §7), serving the task container's files to the platform, which reads them
through the API server's pod proxy (backends/kubernetes/task_files.py):

- `GET /nvct/progress` — 200 with the progress file (`NVCT_PROGRESS_FILE_PATH`) as the
  container wrote it, 204 while there is none, 413 past the bound;
- `GET /nvct/results` — the names of the directories under `NVCT_RESULTS_DIR` (not through a
  link, only names a result may have), oldest first, as a JSON list of at most `maxNames`;
- `GET /nvct/results/<name>` — the files under `NVCT_RESULTS_DIR/<name>` as one uncompressed
  tar stream of exact `Content-Length`: 400 for a name that is not a result's (NVCT's rule,
  not starting with '.': one path segment, never '.' or '..'), 404 when
  there is no such directory, 413 past the bounds on bytes or files, 422 for a symbolic link
  or special file (nothing outside the directory is ever read);
- `GET /nvct/linger` — the container's `preStop` hook: answers once the platform has released
  the pod (`POST /nvct/release`, before it deletes the task) or after `linger` seconds, so
  that a task container that writes its last checkpoint and exits leaves the platform the time
  to fetch it (a native sidecar is stopped when the task container exits).

`?maxBytes=` and `?maxFiles=` lower the sidecar's own bounds for one request. A result's
stream must end within `timeout` seconds, else the connection is cut (the platform then sees
a short body). The volume is mounted read-only: the sidecar never changes the files.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import logging
import os
import stat
import tarfile
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import anyio

from service.backends.worker_utils_pod import (
    LINGER_PATH,
    PROGRESS_PATH,
    RELEASE_PATH,
    RESULT_NAME,
    RESULT_NAME_RULE,
    RESULTS_PATH,
    RESULTS_PREFIX,
)

log = logging.getLogger("nvcf.task_files")

_BLOCK = tarfile.BLOCKSIZE
_CHUNK = 1024 * 1024

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


@dataclass(frozen=True)
class TaskLimits:
    max_progress_bytes: int
    max_result_bytes: int
    max_result_files: int
    #: seconds one result's stream may take
    timeout: float
    #: seconds the `preStop` hook waits for the platform's release
    linger: float = 300.0
    #: names `GET /nvct/results` lists at most (the platform's bound on a task's results)
    max_result_names: int = 1000


class Refused(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


@dataclass(frozen=True)
class Entry:
    """One member of a result's tar stream: its header and, for a file, where and how long."""

    header: bytes
    path: Path | None
    size: int

    @property
    def length(self) -> int:
        return len(self.header) + -(-self.size // _BLOCK) * _BLOCK


def _header(name: str, st: os.stat_result, directory: bool) -> bytes:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
    info.mode = 0o755 if directory else 0o644
    info.size = 0 if directory else st.st_size
    info.mtime = int(st.st_mtime)
    return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape")


def result_entries(root: Path, name: str, max_bytes: int, max_files: int) -> list[Entry]:
    """The tar members of the result `name` under `root`, checked against the bounds."""
    if not RESULT_NAME.fullmatch(name):
        raise Refused(400, f"result name {name!r} is not a result's name ({RESULT_NAME_RULE})")
    top = root / name
    try:
        st = top.lstat()
    except OSError:
        raise Refused(404, f"no result {name!r} in the results directory") from None
    if not stat.S_ISDIR(st.st_mode):
        raise Refused(404, f"result {name!r} is not a directory of the results directory")
    entries = [Entry(_header(name, st, True), None, 0)]
    files = size = 0
    for folder, dirs, names in os.walk(top, followlinks=False):
        dirs.sort()
        for item in sorted(dirs) + sorted(names):
            path = Path(folder) / item
            relative = path.relative_to(root).as_posix()
            st = path.lstat()
            if stat.S_ISDIR(st.st_mode):
                if item in dirs:
                    entries.append(Entry(_header(relative, st, True), None, 0))
                continue
            if not stat.S_ISREG(st.st_mode):
                kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
                raise Refused(422, f"result {name!r}: {relative} is {kind}")
            if not os.access(path, os.R_OK):
                raise Refused(422, f"result {name!r}: {relative} is not readable by the sidecar")
            files += 1
            size += st.st_size
            if files > max_files:
                raise Refused(413, f"result {name!r} holds more than {max_files} files")
            if size > max_bytes:
                raise Refused(413, f"result {name!r} passes {max_bytes} bytes")
            entries.append(Entry(_header(relative, st, False), path, st.st_size))
    return entries


def result_names(root: Path, max_names: int) -> list[str]:
    """The result directories under `root` (never through a link), oldest first; names a
    result may not have (e.g. one being written as `.tmp`) are left out."""
    try:
        entries = os.scandir(root)
    except FileNotFoundError:
        return []
    except PermissionError:
        detail = f"the results directory is not readable by the sidecar (uid {os.getuid()})"
        raise Refused(403, detail) from None
    with entries:
        # only `max_names` are held, however many directories there are
        found = heapq.nsmallest(max_names, filter(None, map(_result_dir, entries)))
    return [name for _, name in found]


def _result_dir(entry: os.DirEntry[str]) -> tuple[int, str] | None:
    if not RESULT_NAME.fullmatch(entry.name):
        return None
    try:
        st = entry.stat(follow_symlinks=False)
    except OSError:  # removed meanwhile
        return None
    return (st.st_mtime_ns, entry.name) if stat.S_ISDIR(st.st_mode) else None


def read_progress(path: Path, max_bytes: int) -> bytes | None:
    """The progress file's bytes, never through a link; None when there is no regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except PermissionError:
        detail = f"the progress file is not readable by the sidecar (uid {os.getuid()})"
        raise Refused(403, detail) from None
    except OSError:
        return None
    with contextlib.closing(os.fdopen(fd, "rb")) as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        raw = fh.read(max_bytes + 1)
    if len(raw) > max_bytes:
        raise Refused(413, f"the progress file passes {max_bytes} bytes")
    return raw


async def tar_stream(entries: list[Entry]) -> AsyncIterator[bytes]:
    """The members as one tar stream; a file whose size changed meanwhile ends it short."""
    for entry in entries:
        yield entry.header
        if entry.path is None:
            continue
        left = entry.size
        async with await anyio.open_file(entry.path, "rb") as fh:
            while left > 0:
                chunk = await fh.read(min(_CHUNK, left))
                if not chunk:
                    raise OSError(f"{entry.path} shrank while it was sent")
                left -= len(chunk)
                yield chunk
        if entry.size % _BLOCK:
            yield b"\0" * (_BLOCK - entry.size % _BLOCK)
    yield b"\0" * (2 * _BLOCK)


class TaskSidecar:
    """The sidecar's ASGI application in a task's pod."""

    def __init__(self, progress_file: Path, results_dir: Path, limits: TaskLimits) -> None:
        self.progress_file = progress_file
        self.results_dir = results_dir
        self.limits = limits
        self.released = anyio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        method = scope["method"]
        try:
            if method == "POST" and path == RELEASE_PATH:
                self.released.set()
                await _answer(send, 204, [], b"")
            elif method != "GET":
                raise Refused(405, f"{method} is not served")
            elif path == PROGRESS_PATH:
                await self._progress(query, send)
            elif path == LINGER_PATH:
                with anyio.move_on_after(self.limits.linger):
                    await self.released.wait()
                await _answer(send, 204, [], b"")
            elif path == RESULTS_PATH:
                await self._names(query, send)
            elif path.startswith(RESULTS_PREFIX):
                await self._result(path.removeprefix(RESULTS_PREFIX), query, send)
            else:
                raise Refused(404, f"{path} is not served")
        except Refused as exc:
            await _refuse(send, exc.status, exc.detail)

    async def _progress(self, query: dict[str, str], send: Send) -> None:
        limit = _bound(query, "maxBytes", self.limits.max_progress_bytes)
        raw = await anyio.to_thread.run_sync(read_progress, self.progress_file, limit)
        if raw is None:
            await _answer(send, 204, [], b"")
        else:
            await _answer(send, 200, [(b"content-type", b"application/json")], raw)

    async def _names(self, query: dict[str, str], send: Send) -> None:
        limit = _bound(query, "maxNames", self.limits.max_result_names)
        names = await anyio.to_thread.run_sync(result_names, self.results_dir, limit)
        body = json.dumps(names).encode()
        await _answer(send, 200, [(b"content-type", b"application/json")], body)

    async def _result(self, name: str, query: dict[str, str], send: Send) -> None:
        max_bytes = _bound(query, "maxBytes", self.limits.max_result_bytes)
        max_files = _bound(query, "maxFiles", self.limits.max_result_files)
        entries = await anyio.to_thread.run_sync(
            result_entries, self.results_dir, name, max_bytes, max_files
        )
        length = sum(e.length for e in entries) + 2 * _BLOCK
        headers = [
            (b"content-type", b"application/x-tar"),
            (b"content-length", str(length).encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        # past the start of the answer a failure can only cut the stream short
        with anyio.fail_after(self.limits.timeout):
            async for chunk in tar_stream(entries):
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


def _bound(query: dict[str, str], key: str, own: int) -> int:
    value = query.get(key)
    if value is None:
        return own
    if not value.isdigit() or int(value) <= 0:
        raise Refused(400, f"{key} must be a positive integer")
    return min(int(value), own)


async def _answer(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _refuse(send: Send, status: int, detail: str) -> None:
    log.warning("task files request refused (%d): %s", status, detail)
    body = json.dumps({"detail": detail}).encode()
    await _answer(send, status, [(b"content-type", b"application/json")], body)


def run(
    *, host: str, port: int, progress_file: Path, results_dir: Path, limits: TaskLimits
) -> None:
    """Serve until stopped (`worker-utils` for a task)."""
    import uvicorn

    app = TaskSidecar(progress_file, results_dir, limits)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        lifespan="off",
        http="h11",
        access_log=False,
        log_level="info",
        timeout_graceful_shutdown=30,
    )
    with contextlib.suppress(KeyboardInterrupt):
        uvicorn.Server(config).run()


__all__ = [
    "TaskLimits",
    "TaskSidecar",
    "result_entries",
    "result_names",
    "run",
    "tar_stream",
]
