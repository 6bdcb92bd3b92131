"""The object store of assets and large results, chosen by `NVCF_ASSET_STORAGE`.

- `LocalStore`: files under `<data dir>/storage`. This server signs the URLs (signing.py)
  and serves them itself (router.py, `/storage/...`). An upload is written to a partial file
  and linked into place only once complete, so a half-finished upload is never visible; a
  second upload of the same object is refused.
- `S3Store`: any S3-compatible store through boto3 (run off the event loop); the store signs
  the URLs (SigV4 query signing) and S3 makes an object visible only once its PUT completes.

Keys are `assets/<uuid>` and `results/<uuid>` (models.py), nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import time
import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from service.assets.signing import Grant, Signer
from service.core.errors import Conflict, PayloadTooLarge
from service.core.settings import Settings

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

KEY_RE = re.compile(
    r"^(assets|results)/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
)
#: the object metadata NVCF keeps an asset's description in, and the header that sets it
DESCRIPTION_META = "nvcf-asset-description"
DESCRIPTION_HEADER = "x-amz-meta-" + DESCRIPTION_META
#: S3's error codes for a missing object (HEAD answers a bare 404)
_MISSING = ("404", "NoSuchKey", "NotFound")
#: a partial upload older than this (seconds past its URL's expiry) is abandoned
PARTIAL_GRACE = 3600


class MissingObject(Exception):
    """The store has no such object (any more)."""


class ObjectStore(Protocol):
    """What the asset service, the result store and the purge need of a store."""

    kind: str

    async def upload_url(
        self,
        key: str,
        *,
        base_url: str,
        max_bytes: int,
        content_type: str | None = None,
        description: str | None = None,
    ) -> str:
        """A signed URL to PUT the object. An asset's (`content_type` and `description`
        given): S3's signs both as NVCF's does (`DESCRIPTION_HEADER`), so the uploader sends
        both; a large result's: the key alone."""
        ...

    async def download_url(self, key: str, *, base_url: str, content_type: str) -> str: ...

    async def size(self, key: str) -> int | None:
        """The object's size, None when there is no (complete) object."""
        ...

    async def delete(self, key: str) -> None: ...

    async def fetch(self, key: str, dest: Path) -> int:
        """Copy the object into the new file `dest`; its size. MissingObject when there is
        none."""
        ...

    async def put_file(self, key: str, path: Path, content_type: str) -> None:
        """Store the file `path` (on the data directory's file system) as `key`; the file
        is moved or removed."""
        ...

    async def older_than(self, prefix: str, cutoff: datetime, limit: int) -> list[str]:
        """Keys under `prefix` ("assets/" or "results/") last written before `cutoff`."""
        ...

    async def sweep(self) -> None:
        """Remove what abandoned uploads left behind (the local store's partial files)."""
        ...


def _check_key(key: str) -> str:
    if not KEY_RE.match(key):
        raise ValueError(f"not an object key: {key!r}")
    return key


class LocalStore:
    kind = "local"

    def __init__(self, root: Path, signer: Signer, url_seconds: int) -> None:
        self.root = root
        self.partial = root / ".partial"
        self.signer = signer
        self.url_seconds = url_seconds

    def prepare(self) -> None:
        for sub in ("assets", "results", ".partial"):
            (self.root / sub).mkdir(mode=0o700, parents=True, exist_ok=True)

    def path(self, key: str) -> Path:
        return self.root / _check_key(key)

    def _expires(self) -> int:
        return int(time.time()) + self.url_seconds

    async def upload_url(
        self,
        key: str,
        *,
        base_url: str,
        max_bytes: int,
        content_type: str | None = None,
        description: str | None = None,
    ) -> str:
        # this server's own URL: the headers an upload carries are not part of it, so both
        # NVCF's client (Content-Type, DESCRIPTION_HEADER) and a plain `curl -T` can use it
        grant = Grant("PUT", _check_key(key), self._expires(), max_bytes=max_bytes)
        return self.signer.url(base_url, grant)

    async def download_url(self, key: str, *, base_url: str, content_type: str) -> str:
        grant = Grant("GET", _check_key(key), self._expires(), content_type=content_type)
        return self.signer.url(base_url, grant)

    async def receive(self, key: str, chunks: AsyncIterator[bytes], max_bytes: int) -> int:
        """Store an upload: refused (413) past `max_bytes`, (409) when the object exists;
        visible only once complete."""
        final = self.path(key)
        if await anyio.Path(final).exists():
            raise Conflict(detail="this object was uploaded already; create a new asset")
        partial = self.partial / f"{uuid.uuid4()}.part"
        size = 0
        try:
            async with await anyio.open_file(partial, "xb") as fh:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > max_bytes:
                        raise PayloadTooLarge(
                            detail=f"the upload exceeds its limit of {max_bytes} bytes"
                        )
                    if chunk:
                        await fh.write(chunk)
            try:
                # a link, not a rename: it fails when a concurrent upload finished first
                await anyio.to_thread.run_sync(os.link, partial, final)
            except FileExistsError:
                raise Conflict(
                    detail="this object was uploaded already; create a new asset"
                ) from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                await anyio.Path(partial).unlink()
        return size

    async def size(self, key: str) -> int | None:
        try:
            stat = await anyio.Path(self.path(key)).stat()
        except FileNotFoundError:
            return None
        return stat.st_size

    async def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            await anyio.Path(self.path(key)).unlink()

    async def fetch(self, key: str, dest: Path) -> int:
        source = self.path(key)

        def copy() -> int:
            # a copy, not a link: the worker may change its file, never the stored object
            try:
                src = source.open("rb")
            except FileNotFoundError:
                raise MissingObject(key) from None
            with src, dest.open("xb") as out:
                shutil.copyfileobj(src, out, 1024 * 1024)
                return out.tell()

        return await anyio.to_thread.run_sync(copy)

    async def put_file(self, key: str, path: Path, content_type: str) -> None:
        final = self.path(key)
        await anyio.to_thread.run_sync(os.replace, path, final)

    async def older_than(self, prefix: str, cutoff: datetime, limit: int) -> list[str]:
        folder = self.root / prefix.strip("/")
        stamp = cutoff.timestamp()

        def scan() -> list[str]:
            found: list[str] = []
            with contextlib.suppress(FileNotFoundError), os.scandir(folder) as entries:
                for entry in entries:
                    key = f"{prefix.strip('/')}/{entry.name}"
                    if KEY_RE.match(key) and entry.stat().st_mtime < stamp:
                        found.append(key)
                        if len(found) >= limit:
                            break
            return found

        return await anyio.to_thread.run_sync(scan)

    async def sweep(self) -> None:
        stamp = time.time() - self.url_seconds - PARTIAL_GRACE

        def scan() -> None:
            with contextlib.suppress(FileNotFoundError), os.scandir(self.partial) as entries:
                for entry in entries:
                    if entry.stat().st_mtime < stamp:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(entry.path)

        await anyio.to_thread.run_sync(scan)


class S3Store:
    kind = "s3"

    def __init__(self, client: S3Client, bucket: str, url_seconds: int) -> None:
        self.client = client
        self.bucket = bucket
        self.url_seconds = url_seconds

    @classmethod
    async def open(cls, settings: Settings) -> S3Store:
        assert settings.asset_s3_bucket is not None  # the settings check it

        def make() -> S3Client:
            import boto3
            from botocore.config import Config

            key_id = settings.asset_s3_access_key_id
            secret = settings.asset_s3_secret_access_key
            return boto3.client(
                "s3",
                endpoint_url=settings.asset_s3_endpoint_url,
                region_name=settings.asset_s3_region,
                aws_access_key_id=key_id.get_secret_value() if key_id else None,
                aws_secret_access_key=secret.get_secret_value() if secret else None,
                config=Config(
                    signature_version="s3v4",
                    # an S3-compatible store at an endpoint: bucket in the path (MinIO and the
                    # like have no per-bucket host names); AWS itself: its own choice
                    s3={"addressing_style": "path" if settings.asset_s3_endpoint_url else "auto"},
                    retries={"max_attempts": 3, "mode": "standard"},
                ),
            )

        client = await asyncio.to_thread(make)
        return cls(client, settings.asset_s3_bucket, settings.asset_url_seconds)

    async def upload_url(
        self,
        key: str,
        *,
        base_url: str,
        max_bytes: int,
        content_type: str | None = None,
        description: str | None = None,
    ) -> str:
        # Signed as NVCF signs it (S3PreSignedUrlGenerator): the content type and the
        # description header, which NVCF's clients send and S3 refuses unsigned; an uploader
        # sends both, e.g. `curl -T FILE -H 'Content-Type: ...' -H '<DESCRIPTION_HEADER>: ...'`.
        # The size is checked when the asset is next counted (S3 cannot bound a PUT).
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": _check_key(key)}
        if content_type is not None:
            params["ContentType"] = content_type
        if description is not None:
            params["Metadata"] = {DESCRIPTION_META: description}
        return await asyncio.to_thread(
            self.client.generate_presigned_url,
            "put_object",
            Params=params,
            ExpiresIn=self.url_seconds,
        )

    async def download_url(self, key: str, *, base_url: str, content_type: str) -> str:
        params = {
            "Bucket": self.bucket,
            "Key": _check_key(key),
            "ResponseContentType": content_type,
        }
        return await asyncio.to_thread(
            self.client.generate_presigned_url,
            "get_object",
            Params=params,
            ExpiresIn=self.url_seconds,
        )

    async def size(self, key: str) -> int | None:
        from botocore.exceptions import ClientError

        try:
            head = await asyncio.to_thread(
                self.client.head_object, Bucket=self.bucket, Key=_check_key(key)
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _MISSING:
                return None
            raise
        return int(head["ContentLength"])

    async def delete(self, key: str) -> None:
        await asyncio.to_thread(self.client.delete_object, Bucket=self.bucket, Key=_check_key(key))

    async def fetch(self, key: str, dest: Path) -> int:
        from botocore.exceptions import ClientError

        def download() -> int:
            with dest.open("xb") as out:
                try:
                    self.client.download_fileobj(self.bucket, _check_key(key), out)
                except ClientError as exc:
                    if exc.response.get("Error", {}).get("Code") in _MISSING:
                        raise MissingObject(key) from None
                    raise
                return out.tell()

        return await asyncio.to_thread(download)

    async def put_file(self, key: str, path: Path, content_type: str) -> None:
        await asyncio.to_thread(
            self.client.upload_file,
            str(path),
            self.bucket,
            _check_key(key),
            ExtraArgs={"ContentType": content_type},
        )
        await anyio.Path(path).unlink(missing_ok=True)

    async def older_than(self, prefix: str, cutoff: datetime, limit: int) -> list[str]:
        def scan() -> list[str]:
            found: list[str] = []
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=prefix
            )
            for page in pages:
                for item in page.get("Contents", []):
                    key = item.get("Key", "")
                    modified = item.get("LastModified")
                    if KEY_RE.match(key) and modified is not None and modified < cutoff:
                        found.append(key)
                        if len(found) >= limit:
                            return found
            return found

        return await asyncio.to_thread(scan)

    async def sweep(self) -> None:
        """Nothing: S3 keeps no partial object (an abandoned multipart upload is the
        bucket's lifecycle rule's to end)."""


async def open_store(settings: Settings, signer: Signer) -> ObjectStore:
    if settings.asset_storage == "s3":
        return await S3Store.open(settings)
    store = LocalStore(settings.data_dir / "storage", signer, settings.asset_url_seconds)
    await anyio.to_thread.run_sync(store.prepare)
    return store
