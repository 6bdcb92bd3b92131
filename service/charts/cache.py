"""Content-addressed on-disk cache of chart archives, bounded in size, safe under concurrency.

Layout under the cache directory:
  blobs/sha256/<hex>       the archive (layer blob), named by its verified sha256
  manifests/sha256/<hex>   JSON {"layer": "sha256:...", "size": N} for a manifest digest
  tmp/                     partial downloads, renamed into place atomically
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

DIGEST_RE = re.compile(r"^sha256:[a-f0-9]{64}$")
_CHUNK = 64 * 1024
# Temp files this old belong to a crashed writer.
_STALE_TMP_SECONDS = 3600


@dataclass(frozen=True)
class ManifestEntry:
    layer_digest: str
    size: int


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


class ChartCache:
    """Archives keyed by layer digest plus a manifest-digest → layer index.

    Blobs are staged in a temp file on the same filesystem, verified by the caller and renamed
    into place, so concurrent processes never see partial files; in-process, `lock(key)`
    serialises work on one key.
    """

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self._blobs = root / "blobs" / "sha256"
        self._manifests = root / "manifests" / "sha256"
        self._tmp = root / "tmp"
        for d in (self._blobs, self._manifests, self._tmp):
            d.mkdir(parents=True, exist_ok=True)
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @staticmethod
    def _hex(digest: str) -> str:
        if not DIGEST_RE.match(digest):
            raise ValueError(f"not a sha256 digest: {digest!r}")
        return digest.split(":", 1)[1]

    def blob_path(self, digest: str) -> Path:
        return self._blobs / self._hex(digest)

    @contextlib.asynccontextmanager
    async def lock(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users <= 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    # --- blocking operations: call from a worker thread -----------------------------------

    def get_blob(self, digest: str) -> Path | None:
        """The cached archive for `digest`, or None; a corrupt file is discarded."""
        path = self.blob_path(digest)
        try:
            if sha256_file(path) != digest:
                path.unlink(missing_ok=True)
                return None
            os.utime(path)  # mark as recently used for LRU eviction
        except FileNotFoundError:
            return None
        return path

    def staged(self, suffix: str = "") -> Path:
        """A fresh temp file path inside the cache (same filesystem as the blobs)."""
        fd, name = tempfile.mkstemp(dir=self._tmp, prefix="stage-", suffix=suffix)
        os.close(fd)
        return Path(name)

    def adopt(self, tmp: Path, digest: str) -> Path:
        """Move a verified temp file into place as blob `digest`."""
        target = self.blob_path(digest)
        os.replace(tmp, target)
        return target

    def get_manifest(self, manifest_digest: str) -> ManifestEntry | None:
        try:
            data = json.loads((self._manifests / self._hex(manifest_digest)).read_text())
            return ManifestEntry(layer_digest=str(data["layer"]), size=int(data["size"]))
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return None

    def put_manifest(self, manifest_digest: str, entry: ManifestEntry) -> None:
        target = self._manifests / self._hex(manifest_digest)
        fd, tmp_name = tempfile.mkstemp(dir=self._tmp, prefix="manifest-")
        with os.fdopen(fd, "w") as f:
            json.dump({"layer": entry.layer_digest, "size": entry.size}, f)
        os.replace(tmp_name, target)

    def evict(self, keep: Path | None = None) -> list[Path]:
        """Delete least recently used blobs until the total fits; never deletes `keep`."""
        entries: list[tuple[float, int, Path]] = []
        for p in self._blobs.iterdir():
            with contextlib.suppress(FileNotFoundError):
                st = p.stat()
                entries.append((st.st_mtime, st.st_size, p))
        total = sum(size for _, size, _ in entries)
        removed: list[Path] = []
        stale = time.time() - _STALE_TMP_SECONDS
        for p in self._tmp.iterdir():
            with contextlib.suppress(FileNotFoundError):
                if p.stat().st_mtime < stale:
                    p.unlink()
        for _, size, p in sorted(entries):
            if total <= self.max_bytes:
                break
            if keep is not None and p == keep:
                continue
            p.unlink(missing_ok=True)
            total -= size
            removed.append(p)
        return removed
