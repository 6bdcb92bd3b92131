"""The chart fetcher: cache first (a pinned digest is served without the registry), then an OCI
pull or an HTTPS chart archive, each checked before it is stored (helm.md §1)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Collection, Sequence
from pathlib import Path
from urllib.parse import urlsplit

import requests

from service.charts.archive import DEFAULT_MAX_FILES, check_archive
from service.charts.cache import DIGEST_RE, ChartCache, ManifestEntry
from service.charts.fetch.common import (
    CHUNK,
    FetchedChart,
    RegistryCredential,
    plain_http_hint,
    short_reason,
    speaks_plain_http,
)
from service.charts.fetch.oci import (
    OciPull,
    parse_manifest,
)
from service.charts.netguard import (
    HostPolicy,
    guard,
)
from service.charts.url import ChartRef, check_host, redact_url
from service.core.errors import BadGateway, BadRequest
from service.core.numbers import natural
from service.core.settings import Settings

# the package's logger, as before the fetcher was cut into modules
log = logging.getLogger("service.charts.fetch")


_DEFAULTS = Settings.model_construct()  # each default is written once, in Settings
_MAX_REMEMBERED_HOSTS = 1024


class ChartFetcher:
    """Fetches charts into a bounded, content-addressed cache. One instance per process."""

    def __init__(
        self,
        cache_dir: Path,
        *,
        allowlist: Collection[str],
        insecure: Collection[str],
        max_bytes: int,
        max_unpacked_bytes: int,
        cache_max_bytes: int = _DEFAULTS.chart_cache_max_bytes,
        timeout: float = _DEFAULTS.chart_fetch_timeout,
        max_files: int = DEFAULT_MAX_FILES,
    ) -> None:
        self.cache = ChartCache(cache_dir, cache_max_bytes)
        self.allowlist = frozenset(h.strip().lower() for h in allowlist if h.strip())
        self.insecure = frozenset(h.strip().lower() for h in insecure if h.strip())
        self.max_bytes = max_bytes
        self.max_unpacked_bytes = max_unpacked_bytes
        self.max_files = max_files
        self.timeout = timeout
        #: registry host -> auth scheme of its /v2/ probe (saves a round trip per pull)
        self._schemes: dict[str, str] = {}

    def _check(self, path: Path, source: str) -> None:
        check_archive(
            path, self.max_bytes, self.max_unpacked_bytes, max_files=self.max_files, source=source
        )

    def _cached(self, manifest_digest: str, source: str) -> tuple[ManifestEntry, Path] | None:
        entry = self.cache.get_manifest(manifest_digest)
        if entry is None:
            return None
        path = self.cache.get_blob(entry.layer_digest)
        if path is None:
            return None
        self._check(path, source)
        return entry, path

    async def cached(self, ref: ChartRef, digest: str) -> FetchedChart | None:
        """The pinned chart from the cache (its archive checked again), or None: no network,
        no credentials needed."""
        if not DIGEST_RE.match(digest):
            return None
        hit = await asyncio.to_thread(self._cached, digest, redact_url(ref.url))
        if hit is None:
            return None
        entry, path = hit
        return FetchedChart(ref, digest, path, entry.size, entry.layer_digest, cached=True)

    def _policy(self, ref: ChartRef, addresses: Sequence[str]) -> HostPolicy:
        policy = HostPolicy(ref.host, self.allowlist, self.insecure, redact_url(ref.url))
        policy.pin(ref.host, ref.hostname, ref.port, addresses)
        return policy

    async def fetch(
        self,
        ref: ChartRef,
        credentials: Sequence[RegistryCredential],
        *,
        digest: str | None = None,
    ) -> FetchedChart:
        """Pull `ref` (by its tag, or by the pinned manifest `digest`) into the cache.

        A pinned digest already in the cache is served without any network access; callers
        must only pin digests recorded by an earlier, authorised fetch of the same account.
        """
        if digest is not None:
            if not DIGEST_RE.match(digest):
                raise BadRequest(detail=f"'{digest}' is not a sha256 manifest digest.")
            hit = await self.cached(ref, digest)
            if hit is not None:
                return hit
        policy = self._policy(ref, await check_host(ref, self.allowlist))
        if ref.scheme == "https":
            return await self._fetch_https(ref, credentials, digest, policy)
        return await self._fetch_oci(ref, credentials, digest, policy)

    async def _fetch_oci(
        self,
        ref: ChartRef,
        credentials: Sequence[RegistryCredential],
        pinned: str | None,
        policy: HostPolicy,
    ) -> FetchedChart:
        source = redact_url(ref.url)
        if len(self._schemes) > _MAX_REMEMBERED_HOSTS:
            self._schemes.clear()
        pull = OciPull(ref, credentials, policy, self.timeout, self._schemes)
        body, manifest_digest = await asyncio.to_thread(pull.manifest, pinned or ref.version)
        if pinned is not None and manifest_digest != pinned:
            raise BadGateway(
                detail=f"Registry {ref.host} returned a manifest hashing to {manifest_digest} "
                f"for the pinned digest {pinned} of chart {source}."
            )
        entry = parse_manifest(body, source, self.max_bytes)
        async with self.cache.lock(entry.layer_digest):
            path, cached = await asyncio.to_thread(
                self._store_oci, pull, entry, manifest_digest, source
            )
        log.info("chart %s: manifest %s, archive %s", source, manifest_digest, entry.layer_digest)
        return FetchedChart(
            ref, manifest_digest, path, entry.size, entry.layer_digest, cached=cached
        )

    def _store_oci(
        self, pull: OciPull, entry: ManifestEntry, manifest_digest: str, source: str
    ) -> tuple[Path, bool]:
        """The archive from the cache or downloaded into it, checked, its manifest recorded
        and the cache trimmed (one worker-thread hop; the caller holds the digest's lock)."""
        path = self.cache.get_blob(entry.layer_digest)
        cached = path is not None
        if path is None:
            path = self._download_oci(pull, entry, source)
        else:
            self._check(path, source)
        self.cache.put_manifest(manifest_digest, entry)
        self.cache.evict(path)
        return path, cached

    def _download_oci(self, pull: OciPull, entry: ManifestEntry, source: str) -> Path:
        tmp = self.cache.staged(".tgz")
        try:
            pull.download(entry.layer_digest, entry.size, tmp)
            self._check(tmp, source)
            return self.cache.adopt(tmp, entry.layer_digest)
        finally:
            tmp.unlink(missing_ok=True)

    async def _fetch_https(
        self,
        ref: ChartRef,
        credentials: Sequence[RegistryCredential],
        pinned: str | None,
        policy: HostPolicy,
    ) -> FetchedChart:
        digest, size = await asyncio.to_thread(
            self._download_https, ref, credentials, policy, pinned
        )
        path = self.cache.blob_path(digest)
        await asyncio.to_thread(self.cache.evict, path)
        return FetchedChart(ref, digest, path, size, digest)

    def _download_https(
        self,
        ref: ChartRef,
        credentials: Sequence[RegistryCredential],
        policy: HostPolicy,
        pinned: str | None,
    ) -> tuple[str, int]:
        source = redact_url(ref.url)
        url = f"{policy.scheme_for(ref.host)}://{ref.host}{urlsplit(ref.url).path}"
        session = requests.Session()
        guard(session, policy, self.timeout)
        tmp = self.cache.staged(".tgz")
        saw_not_found = False
        try:
            for credential in [*credentials, None]:
                auth = (credential.username, credential.password) if credential else None
                try:
                    response = session.get(url, auth=auth, stream=True)
                except requests.RequestException as exc:
                    reason = plain_http_hint(ref.host) if speaks_plain_http(exc) else None
                    raise BadGateway(
                        detail=f"Could not reach {ref.host} to download chart {source}: "
                        f"{reason or short_reason(exc)}."
                    ) from None
                with response:
                    if response.status_code in (401, 403):
                        continue
                    if response.status_code == 404:
                        saw_not_found = True
                        continue
                    if response.status_code != 200:
                        raise BadGateway(
                            detail=f"{ref.host} answered {response.status_code} "
                            f"{response.reason or ''}".rstrip()
                            + f" to the download of chart {source}."
                        )
                    digest, size = self._stream_https(response, tmp, source)
                if pinned is not None and digest != pinned:
                    raise BadGateway(
                        detail=f"Chart {source} changed: it now hashes to {digest}, not to the "
                        f"pinned digest {pinned}."
                    )
                self._check(tmp, source)
                entry = ManifestEntry(layer_digest=digest, size=size)
                self.cache.adopt(tmp, digest)
                self.cache.put_manifest(digest, entry)
                return digest, size
            if saw_not_found:
                raise BadRequest(detail=f"chart {source} not found")
            raise BadRequest(detail=f"no credential was valid to pull chart {source}")
        finally:
            tmp.unlink(missing_ok=True)
            session.close()

    def _stream_https(self, response: requests.Response, tmp: Path, source: str) -> tuple[str, int]:
        declared = response.headers.get("content-length", "")
        length = natural(declared)
        if length is not None and length > self.max_bytes:
            raise BadRequest(
                detail=f"Chart archive '{source}' was rejected (archive-compressed-size): it is "
                f"{declared} bytes, more than the limit of {self.max_bytes} bytes."
            )
        h = hashlib.sha256()
        size = 0
        try:
            with tmp.open("wb") as out:
                for chunk in response.iter_content(CHUNK):
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise BadRequest(
                            detail=f"Chart archive '{source}' was rejected "
                            "(archive-compressed-size): it is more than the limit of "
                            f"{self.max_bytes} bytes."
                        )
                    h.update(chunk)
                    out.write(chunk)
        except requests.RequestException as exc:
            raise BadGateway(
                detail=f"Downloading chart {source} failed: {short_reason(exc)}."
            ) from None
        return "sha256:" + h.hexdigest(), size
