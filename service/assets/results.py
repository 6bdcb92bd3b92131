"""Large results: an answer body over `NVCF-MAX-RESPONSE-SIZE-BYTES`, or any file the worker
wrote into its `NVCF-LARGE-OUTPUT-DIR`, kept as one zip object in the store, as NVCF's worker
utilities build it: `<requestId>.response` holds the body, each output file keeps its path
relative to the directory. The caller gets a signed download URL for it (a 302 `Location`;
exec's `responseReference`). Results are deleted `NVCF_INVOKE_RESULT_TTL_SECONDS` after they
were stored (the purge, service.py).
"""

from __future__ import annotations

import contextlib
import os
import stat
import uuid
import zipfile
from collections.abc import AsyncIterable, AsyncIterator
from pathlib import Path
from typing import BinaryIO

import anyio

from service.assets.files import Output, TooManyOutputs, WorkerFiles
from service.assets.models import result_key
from service.assets.service import Assets

ZIP_TYPE = "application/zip"
_COPY_CHUNK = 1024 * 1024


class ResultTooLarge(Exception):
    """The body and the outputs together pass `NVCF_ASSET_RESULT_MAX_BYTES`, there are too
    many files, or one cannot be read: the request ends errored, with this message."""


def response_name(request_id: uuid.UUID) -> str:
    return f"{request_id}.response"


async def store_result(
    assets: Assets,
    request_id: uuid.UUID,
    body: AsyncIterable[bytes],
    files: WorkerFiles | None,
    base_url: str,
) -> str:
    """Keep the answer `body` (streamed to a spool file, bounded) and the worker's output
    files as the request's large result; its signed download URL."""
    settings = assets.settings
    async with zipped_result(
        settings.asset_files_root / "results",
        request_id,
        body,
        files,
        max_bytes=settings.asset_result_max_bytes,
        max_files=settings.asset_result_max_files,
    ) as archive:
        await assets.store.put_file(result_key(request_id), archive, ZIP_TYPE)
    return await assets.result_url(request_id, base_url)


@contextlib.asynccontextmanager
async def zipped_result(
    spool_dir: Path,
    request_id: uuid.UUID,
    body: AsyncIterable[bytes],
    files: WorkerFiles | None,
    *,
    max_bytes: int,
    max_files: int,
) -> AsyncIterator[Path]:
    """The large result's zip, built in `spool_dir` (the body spooled first, bounded) and
    removed on leaving; the server stores it (`store_result`), the worker-utils sidecar
    uploads it to its signed URL (worker_utils.py). `ResultTooLarge` past a bound."""
    await anyio.Path(spool_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
    spool = spool_dir / f"{request_id}.body"
    archive = spool_dir / f"{request_id}.zip"
    try:
        size = 0
        async with await anyio.open_file(spool, "wb") as fh:
            async for chunk in body:
                size += len(chunk)
                if size > max_bytes:
                    raise ResultTooLarge(
                        f"the answer passes {max_bytes} bytes (NVCF_ASSET_RESULT_MAX_BYTES)"
                    )
                await fh.write(chunk)
        outputs: list[Output] = []
        if files is not None:
            try:
                outputs = await files.outputs(max_files, max_bytes - size)
            except TooManyOutputs as exc:
                raise ResultTooLarge(str(exc)) from None
        await anyio.to_thread.run_sync(_zip, archive, request_id, spool, outputs, max_bytes - size)
        yield archive
    finally:
        for path in (spool, archive):
            with contextlib.suppress(FileNotFoundError):
                await anyio.Path(path).unlink()


def _zip(
    archive: Path, request_id: uuid.UUID, spool: Path, outputs: list[Output], budget: int
) -> None:
    # Stored, not deflated: results are mostly media that does not compress, and the zip is
    # written while the caller waits.
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        zf.write(spool, response_name(request_id))
        for output in outputs:
            with (
                _open_regular(output.path) as src,
                zf.open(zipfile.ZipInfo(output.name), "w", force_zip64=True) as dst,
            ):
                while chunk := src.read(_COPY_CHUNK):
                    budget -= len(chunk)
                    if budget < 0:  # the worker is still writing it
                        raise ResultTooLarge(
                            "the worker's outputs grew past NVCF_ASSET_RESULT_MAX_BYTES"
                        )
                    dst.write(chunk)


def _open_regular(path: Path) -> BinaryIO:
    """The file, opened without following a link (the scan saw a regular file; a worker may
    have swapped it for a link to something else since)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise ResultTooLarge(f"output {path.name} cannot be read: {exc.strerror}") from None
    fh = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        fh.close()
        raise ResultTooLarge(f"output {path.name} is no longer a regular file")
    return fh
