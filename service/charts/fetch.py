"""Pull Helm charts from OCI registries (oras-py) or HTTPS chart archives into the cache.

helm.md §1: SSRF guard, credentials then anonymous, manifest digest recorded, layer size checked
from the manifest before download, blob verified by sha256, archive safety checked before use.
"""

from __future__ import annotations

import asyncio
import difflib
import hashlib
import json
import logging
import re
import socket
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urljoin, urlsplit

import oras.provider
import requests
from urllib3.exceptions import MaxRetryError

from service.charts import netguard
from service.charts.archive import DEFAULT_MAX_FILES, check_archive
from service.charts.cache import DIGEST_RE, ChartCache, ManifestEntry
from service.charts.netguard import PinnedAdapter, forbidden_reason, host_key
from service.charts.url import ChartRef, check_host, redact_url
from service.core.errors import BadGateway, BadRequest, FieldError
from service.core.numbers import natural
from service.core.settings import Settings

log = logging.getLogger(__name__)

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
HELM_CONFIG = "application/vnd.cncf.helm.config.v1+json"
HELM_CHART_LAYER = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
_DEFAULTS = Settings.model_construct()  # each default is written once, in Settings
_MAX_MANIFEST_BYTES = 4 * 1024 * 1024
_CHUNK = 64 * 1024
_MAX_UPSTREAM_TEXT = 300
_MAX_REMEMBERED_HOSTS = 1024
#: "chart not found" lists at most this many of the repository's tags ...
MAX_TAGS_SHOWN = 20
#: ... from one page of the OCI tags list of at most this many tags and bytes
_TAGS_PAGE = 1000
_MAX_TAGS_BYTES = 256 * 1024
#: an OCI tag (distribution spec); anything else a registry lists is not shown
_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
#: how OpenSSL reports a TLS handshake answered in plain HTTP
_PLAIN_HTTP_SIGNS = ("WRONG_VERSION_NUMBER", "wrong version number", "RECORD_LAYER_FAILURE")

# oras' do_request sleeps and retries up to five times on any error; callers here want one
# attempt and a prompt 502, so use the undecorated method (oras' own auth handling stays).
_DO_REQUEST: Callable[..., requests.Response] = getattr(
    oras.provider.Registry.do_request, "__wrapped__", oras.provider.Registry.do_request
)


@dataclass(frozen=True)
class RegistryCredential:
    """One stored registry credential of the account; the password never appears in reprs."""

    username: str
    password: str = field(repr=False)


@dataclass(frozen=True)
class FetchedChart:
    """A chart archive in the cache, checked for safety."""

    ref: ChartRef
    digest: str  # manifest digest (OCI) or archive digest (https)
    archive_path: Path
    size: int
    layer_digest: str = ""
    cached: bool = False  # True when the archive came from the cache without a download


class _Denied(Exception):
    """The registry refused this credential (401/403 or no usable auth challenge)."""


class _NotFound(Exception):
    pass


def _short_reason(exc: BaseException) -> str:
    """A one-line cause of a transport failure, without object reprs."""
    if isinstance(exc, requests.Timeout):
        return "the connection timed out"
    inner: object = exc.args[0] if exc.args else exc
    if isinstance(inner, MaxRetryError) and inner.reason is not None:
        inner = inner.reason
    text = re.sub(r"<[^>]*object at 0x[0-9a-f]+>:?\s*", "", str(inner)).strip()
    return text[:_MAX_UPSTREAM_TEXT] or type(exc).__name__


def _speaks_plain_http(exc: BaseException) -> bool:
    """Whether a TLS handshake failed because the server answered in plain HTTP."""
    return isinstance(exc, requests.exceptions.SSLError) and any(
        sign in str(exc) for sign in _PLAIN_HTTP_SIGNS
    )


def _plain_http_hint(host: str) -> str:
    return (
        f"{host} seems to speak plain HTTP, not HTTPS (the TLS handshake was answered in "
        "plain text); if this registry is meant to be used over plain HTTP, the operator "
        "must list it in NVCF_INSECURE_REGISTRIES"
    )


@dataclass(frozen=True)
class _Tags:
    """One bounded page of a repository's tags; `more` when the registry has others."""

    tags: list[str]
    more: bool = False
    repository_missing: bool = False


def _numeric_version_hint(reference: str, tags: Sequence[str]) -> str:
    """The surprise of an unquoted `version: 1.0` in Chart.yaml, which Helm reads as the
    number 1 (and pushes as tag `1`), when the repository has that tag."""
    if "." not in reference:
        return ""
    try:
        number = format(Decimal(reference).normalize(), "f")
    except (InvalidOperation, ValueError):
        return ""
    if number == reference or number not in tags:
        return ""
    return (
        f"; note that Helm reads an unquoted `version: {reference}` in Chart.yaml as the "
        f"number {number}, so such a chart is pushed as tag '{number}': use that tag, or quote "
        "the version and push again"
    )


def _natural(tag: str) -> list[str | tuple[int, str]]:
    """Sort key putting 1.9.0 before 1.10.0 (text and numbers alternate in every key; a
    number compares by its length, then its digits: a registry's tag may hold any number of
    them, more than `int` reads)."""
    return [
        (len(part), part) if i % 2 else part for i, part in enumerate(re.split(r"0*([0-9]+)", tag))
    ]


def _shown_tags(reference: str, tags: list[str]) -> list[str]:
    """At most MAX_TAGS_SHOWN tags, the ones most like `reference`, in version order."""
    if len(tags) > MAX_TAGS_SHOWN:
        tags = difflib.get_close_matches(reference, tags, n=MAX_TAGS_SHOWN, cutoff=0.0)
    return sorted(tags, key=_natural)


def _upstream_errors(response: requests.Response) -> str:
    """The registry's own error messages from an OCI error body, if any."""
    try:
        body = json.loads(response.content[:65536])
        messages = [
            str(e.get("message", "")) for e in body.get("errors", []) if isinstance(e, dict)
        ]
    except (ValueError, AttributeError, requests.RequestException):
        return ""
    text = "; ".join(m for m in messages if m)
    return f": {text[:_MAX_UPSTREAM_TEXT]}" if text else ""


class _GuardedAdapter(PinnedAdapter):
    """Applies the timeout and the SSRF/plain-HTTP policy to every request, including token
    realms on other hosts and each redirect hop, and connects only to the addresses the policy
    checked and pinned."""

    def __init__(self, policy: _HostPolicy, timeout: float) -> None:
        super().__init__(policy, max_retries=0)
        self._policy = policy
        self._timeout = timeout

    def send(  # type: ignore[override]
        self, request: requests.PreparedRequest, **kwargs: Any
    ) -> requests.Response:
        self._policy.check_url(str(request.url))
        if kwargs.get("timeout") is None:
            kwargs["timeout"] = self._timeout
        return super().send(request, **kwargs)


def _default_port(scheme: str) -> int:
    return 80 if scheme == "http" else 443


@dataclass
class _HostPolicy:
    """Which hosts and schemes a pull may contact, and the checked addresses of each host.

    Each host is resolved once per pull (the chart's own host by `check_host` already); its
    addresses are checked and pinned, and connections go only to pinned addresses.
    """

    registry_host: str
    allowlist: Collection[str]
    insecure: Collection[str]
    source: str
    _pins: dict[tuple[str, int], list[str]] = field(default_factory=dict)

    def _listed(self, host: str, hosts: Collection[str]) -> bool:
        hostname = urlsplit(f"//{host}").hostname or host
        listed = {h.strip().lower() for h in hosts}
        return host in listed or hostname in listed

    def scheme_for(self, host: str) -> str:
        return "http" if self._listed(host, self.insecure) else "https"

    def pin(self, ref: ChartRef, addresses: Sequence[str]) -> None:
        """Pin the chart host's addresses that `check_host` resolved and checked."""
        if addresses:
            port = ref.port or _default_port(self.scheme_for(ref.host))
            self._pins[host_key(ref.hostname, port)] = list(addresses)

    def pinned(self, hostname: str, port: int) -> Sequence[str]:
        """The checked addresses of a host (netguard.AddressBook); every request passes
        `check_url` first, so an unpinned host here is refused rather than looked up."""
        addresses = self._pins.get(host_key(hostname, port))
        if not addresses:
            raise BadGateway(
                detail=f"Refused to contact {hostname}:{port} while pulling chart "
                f"{self.source}: its address was not checked."
            )
        return addresses

    def _refusal(self, host: str) -> BadGateway:
        # The same text whatever the address and whatever listens there: no connection is
        # attempted, and neither the address nor the port state shows (no scan oracle).
        return BadGateway(
            detail=f"Refused to contact {host} (named by registry {self.registry_host}) while "
            f"pulling chart {self.source}: it resolves to a non-public address; allow it "
            "with NVCF_REGISTRY_ALLOWLIST."
        )

    def check_url(self, url: str) -> None:
        parts = urlsplit(url)
        host = parts.netloc.lower()
        if parts.scheme != "https" and not (
            parts.scheme == "http" and self._listed(host, self.insecure)
        ):
            raise BadGateway(
                detail=f"Refused to contact {parts.scheme}://{host} while pulling chart "
                f"{self.source}: plain HTTP is only used for registries listed in "
                "NVCF_INSECURE_REGISTRIES."
            )
        hostname = parts.hostname or host
        port = parts.port or _default_port(parts.scheme)
        key = host_key(hostname, port)
        if key in self._pins:
            return
        try:
            addresses = netguard.resolve(hostname, port)
        except socket.gaierror as exc:
            raise BadGateway(
                detail=f"Could not resolve {host} (named by registry {self.registry_host}) "
                f"while pulling chart {self.source}: {exc.strerror or exc}."
            ) from None
        if not addresses:
            raise BadGateway(
                detail=f"Could not resolve {host} (named by registry {self.registry_host}) "
                f"while pulling chart {self.source}: no address."
            )
        if not self._listed(host, self.allowlist) and any(
            forbidden_reason(address) is not None for address in addresses
        ):
            raise self._refusal(host)
        self._pins[key] = addresses

    def redirect_hook(self, response: requests.Response, *args: Any, **kwargs: Any) -> None:
        if not response.is_redirect:
            return
        target = urljoin(response.url, response.headers.get("location", ""))
        parts = urlsplit(target)
        origin = urlsplit(response.url)
        if parts.netloc.lower() != origin.netloc.lower() or (
            parts.scheme == "http" and origin.scheme == "https"
        ):
            raise BadGateway(
                detail=f"Registry {origin.netloc} redirected to {parts.scheme}://{parts.netloc} "
                f"while pulling chart {self.source}; redirects to other hosts or to plain HTTP "
                "are refused."
            )


def _guard(session: requests.Session, policy: _HostPolicy, timeout: float) -> None:
    adapter = _GuardedAdapter(policy, timeout)
    session.mount("https://", adapter)
    session.mount("http://", adapter)
    session.hooks["response"].append(policy.redirect_hook)


def _close_refusal(response: requests.Response, *args: Any, **kwargs: Any) -> None:
    """Release a streamed 401/403 at once: only its status and headers are used, and oras
    drops the challenge response unclosed when answering it fails (token realm unreachable),
    which would leak its connection."""
    if kwargs.get("stream") and response.status_code in (401, 403):
        response.close()


def _read_limited(response: requests.Response, limit: int, what: str, source: str) -> bytes:
    chunks: list[bytes] = []
    total = 0
    for chunk in response.iter_content(_CHUNK):
        total += len(chunk)
        if total > limit:
            response.close()
            raise BadGateway(
                detail=f"The registry sent a {what} larger than {limit} bytes for chart {source}."
            )
        chunks.append(chunk)
    return b"".join(chunks)


class _OciPull:
    """Blocking OCI pull steps for one chart; run in a worker thread."""

    def __init__(
        self,
        ref: ChartRef,
        credentials: Sequence[RegistryCredential],
        policy: _HostPolicy,
        timeout: float,
        schemes: dict[str, str] | None = None,
    ) -> None:
        self.ref = ref
        #: host -> auth scheme answered by its /v2/ probe, shared by the fetcher's pulls
        self.schemes = schemes if schemes is not None else {}
        self.source = redact_url(ref.url)
        self.credentials = list(credentials)
        self.policy = policy
        self.timeout = timeout
        scheme = policy.scheme_for(ref.host)
        self.insecure = scheme == "http"
        self.root = f"{scheme}://{ref.host}/v2/"
        self.base = f"{self.root}{ref.repository}"
        self.registry: oras.provider.Registry | None = None
        self.anonymous_basic = False
        self._saw_not_found = False
        #: the registry client (and its anonymous mode) that was answered 404: it may list tags
        self._not_found_with: tuple[oras.provider.Registry, bool] | None = None

    def _transport_error(self, exc: requests.RequestException) -> BadGateway:
        failed = urlsplit(str(exc.request.url)) if exc.request is not None else None
        if failed is not None and (
            failed.netloc != self.ref.host or not failed.path.startswith("/v2/")
        ):
            # not the registry API: the token server its auth challenge pointed to
            return BadGateway(
                detail=f"Could not reach the token server {failed.netloc} of registry "
                f"{self.ref.host} to pull chart {self.source}: {_short_reason(exc)}."
            )
        reason = _plain_http_hint(self.ref.host) if _speaks_plain_http(exc) else None
        return BadGateway(
            detail=f"Could not reach registry {self.ref.host} to pull chart {self.source}: "
            f"{reason or _short_reason(exc)}."
        )

    def _status_error(self, response: requests.Response, what: str) -> BadGateway:
        return BadGateway(
            detail=f"Registry {self.ref.host} answered {response.status_code} "
            f"{response.reason or ''}".rstrip()
            + f" to the {what} request for chart {self.source}{_upstream_errors(response)}."
        )

    def _new_registry(self, backend: str) -> oras.provider.Registry:
        registry = oras.provider.Registry(
            hostname=self.ref.host, insecure=self.insecure, auth_backend=backend
        )
        _guard(registry.session, self.policy, self.timeout)
        registry.session.hooks["response"].append(_close_refusal)
        return registry

    def _challenge(self) -> str:
        """Ping /v2/ as Docker does: 'basic', 'bearer' or 'none' (anonymous API access)."""
        session = requests.Session()
        _guard(session, self.policy, self.timeout)
        try:
            with session.get(self.root, stream=True) as response:
                status = response.status_code
                header = response.headers.get("www-authenticate", "")
                if status in (401, 403):
                    if header.lower().startswith("basic"):
                        return "basic"
                    return "bearer"
                if status >= 500:
                    raise self._status_error(response, "API version check")
                return "none"
        except requests.RequestException as exc:
            raise self._transport_error(exc) from None
        finally:
            session.close()

    def _attempt(
        self, registry: oras.provider.Registry, url: str, headers: Mapping[str, str], stream: bool
    ) -> requests.Response:
        response: requests.Response
        try:
            if self.anonymous_basic:
                response = registry.session.get(url, headers=dict(headers), stream=stream)
            else:
                response = _DO_REQUEST(registry, url, "GET", headers=dict(headers), stream=stream)
        except requests.RequestException as exc:
            raise self._transport_error(exc) from None
        except (ValueError, AttributeError, KeyError, TypeError) as exc:
            # oras raises these when an auth challenge cannot be answered with this credential
            raise _Denied from exc
        if response.status_code in (401, 403):
            response.close()
            raise _Denied
        if response.status_code == 404:
            response.close()
            raise _NotFound
        return response

    def manifest(self, reference: str) -> tuple[bytes, str]:
        """Fetch the manifest trying each credential, then anonymous; returns (bytes, digest).

        The auth scheme of the host comes from a `/v2/` probe, remembered per host; when every
        attempt is refused under a remembered scheme, the host is probed again and, if its
        scheme changed, tried once more.
        """
        key = self.ref.host.lower()
        remembered = self.schemes.get(key)
        kind = remembered or self._challenge()
        self.schemes[key] = kind
        found = self._manifest_with(kind, reference)
        if found is None and remembered is not None:
            fresh = self._challenge()
            self.schemes[key] = fresh
            if fresh != remembered:
                found = self._manifest_with(fresh, reference)
        if found is not None:
            return found
        self._refused(reference, saw_not_found=self._saw_not_found)

    def _manifest_with(self, kind: str, reference: str) -> tuple[bytes, str] | None:
        """The manifest under auth scheme `kind`, or None when every attempt was refused or
        not found (`_saw_not_found` says whether any was a 404)."""
        url = f"{self.base}/manifests/{reference}"
        headers = {"Accept": OCI_MANIFEST}
        saw_not_found = False
        attempts: list[RegistryCredential | None] = [*self.credentials, None]
        for credential in attempts:
            if credential is None:
                registry = self._new_registry("basic" if kind == "basic" else "token")
                self.anonymous_basic = kind == "basic"
            else:
                registry = self._new_registry("basic" if kind == "basic" else "token")
                registry.auth.set_basic_auth(credential.username, credential.password)
                self.anonymous_basic = False
            try:
                response = self._attempt(registry, url, headers, stream=True)
            except _Denied:
                continue
            except _NotFound:
                saw_not_found = True
                self._not_found_with = (registry, self.anonymous_basic)
                continue
            with response:
                if response.status_code != 200:
                    raise self._status_error(response, "manifest")
                body = _read_limited(response, _MAX_MANIFEST_BYTES, "manifest", self.source)
            self.registry = registry
            return body, "sha256:" + hashlib.sha256(body).hexdigest()
        self._saw_not_found = saw_not_found
        return None

    def tags(self) -> _Tags | None:
        """One bounded page of the repository's tags, asked with the credential that was
        answered 404 (the same guarded client); None when the registry does not allow
        listing or the listing fails (then the message just has no tags)."""
        if self._not_found_with is None:
            return None
        registry, self.anonymous_basic = self._not_found_with
        url = f"{self.base}/tags/list?n={_TAGS_PAGE}"
        try:
            response = self._attempt(registry, url, {"Accept": "application/json"}, stream=True)
        except _NotFound:
            return _Tags([], repository_missing=True)
        except (_Denied, BadGateway):
            return None
        try:
            with response:
                if response.status_code != 200:
                    return None
                body = _read_limited(response, _MAX_TAGS_BYTES, "tag list", self.source)
                more = 'rel="next"' in response.headers.get("link", "")
        except (BadGateway, requests.RequestException):
            return None
        try:
            listed = json.loads(body).get("tags")
        except (ValueError, AttributeError):
            return None
        listed = listed if isinstance(listed, list) else []
        tags = [t for t in listed if isinstance(t, str) and _TAG_RE.match(t)]
        return _Tags(tags[:_TAGS_PAGE], more=more or len(tags) > _TAGS_PAGE)

    def _not_found_message(self, reference: str) -> str:
        repository = self.ref.repository
        missing = f"registry {self.ref.host} has no tag or digest '{reference}' in repository "
        listing = self.tags()
        if listing is None:
            return f"{missing}'{repository}'"
        if listing.repository_missing:
            return f"registry {self.ref.host} has no repository '{repository}'"
        if not listing.tags:
            return f"{missing}'{repository}', which has no tags"
        shown = _shown_tags(reference, listing.tags)
        count = f"{len(listing.tags)}{'+' if listing.more else ''}"
        which = (
            f"its tags are: {', '.join(shown)}"
            if len(shown) == len(listing.tags) and not listing.more
            else f"{len(shown)} of its {count} tags (the closest): {', '.join(shown)}"
        )
        return f"{missing}'{repository}'; {which}" + _numeric_version_hint(reference, listing.tags)

    def _refused(self, reference: str, *, saw_not_found: bool) -> NoReturn:
        if saw_not_found:
            message = self._not_found_message(reference)
            raise BadRequest(
                detail=f"chart {self.source} not found: {message}",
                errors=[FieldError(field="helmChart", message=message)],
            )
        raise BadRequest(
            detail=f"no credential was valid to pull chart {self.source}",
            errors=[
                FieldError(
                    field="helmChart",
                    message=f"registry {self.ref.host} refused {len(self.credentials)} stored "
                    "credential(s) for this host and anonymous access",
                )
            ],
        )

    def download(self, layer_digest: str, size: int, target: Path) -> None:
        """Stream the layer blob into `target`, checking its size and sha256."""
        assert self.registry is not None, "manifest() must succeed first"
        url = f"{self.base}/blobs/{layer_digest}"
        try:
            response = self._attempt(self.registry, url, {}, stream=True)
        except _Denied:
            raise BadRequest(
                detail=f"no credential was valid to pull chart {self.source}"
            ) from None
        except _NotFound:
            raise BadRequest(detail=f"chart {self.source} not found") from None
        digest = hashlib.sha256()
        received = 0
        try:
            with response, target.open("wb") as out:
                if response.status_code != 200:
                    raise self._status_error(response, "chart download")
                for chunk in response.iter_content(_CHUNK):
                    received += len(chunk)
                    if received > size:
                        raise BadGateway(
                            detail=f"Registry {self.ref.host} sent more than the {size} bytes "
                            f"its manifest declares for chart {self.source}."
                        )
                    digest.update(chunk)
                    out.write(chunk)
        except requests.RequestException as exc:
            raise self._transport_error(exc) from None
        if received != size:
            raise BadGateway(
                detail=f"Registry {self.ref.host} sent {received} bytes for chart {self.source}, "
                f"but its manifest declares {size}."
            )
        actual = "sha256:" + digest.hexdigest()
        if actual != layer_digest:
            raise BadGateway(
                detail=f"The chart archive from registry {self.ref.host} for chart "
                f"{self.source} hashes to {actual}, not to the digest {layer_digest} its "
                "manifest declares."
            )


def _parse_manifest(body: bytes, source: str, max_bytes: int) -> ManifestEntry:
    """Find the Helm chart layer; refuse non-charts and oversized layers before download."""
    try:
        manifest = json.loads(body)
    except ValueError:
        raise BadGateway(
            detail=f"The registry sent a manifest for chart {source} that is not JSON."
        ) from None
    if not isinstance(manifest, dict):
        raise BadGateway(detail=f"The registry sent a malformed manifest for chart {source}.")
    media_type = manifest.get("mediaType", OCI_MANIFEST)
    if media_type == OCI_INDEX or "manifests" in manifest:
        raise BadRequest(
            detail=f"{source} is not a Helm chart: it is an image index ({media_type})."
        )
    config = manifest.get("config")
    config_type = config.get("mediaType") if isinstance(config, dict) else None
    if config_type != HELM_CONFIG:
        raise BadRequest(
            detail=f"{source} is not a Helm chart: its config media type is '{config_type}', "
            f"expected '{HELM_CONFIG}'."
        )
    layers = manifest.get("layers")
    chart_layers = [
        layer
        for layer in (layers if isinstance(layers, list) else [])
        if isinstance(layer, dict) and layer.get("mediaType") == HELM_CHART_LAYER
    ]
    if len(chart_layers) != 1:
        raise BadRequest(
            detail=f"{source} is not a Helm chart: it has {len(chart_layers)} layers of media "
            f"type '{HELM_CHART_LAYER}', expected exactly one."
        )
    layer = chart_layers[0]
    digest, size = layer.get("digest"), layer.get("size")
    if not isinstance(digest, str) or not DIGEST_RE.match(digest):
        raise BadRequest(
            detail=f"The chart layer of {source} has digest '{digest}'; only sha256 digests "
            "are supported."
        )
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise BadGateway(detail=f"The chart layer of {source} declares an invalid size {size!r}.")
    if size > max_bytes:
        raise BadRequest(
            detail=f"Chart archive '{source}' was rejected (archive-compressed-size): the "
            f"registry declares {size} bytes, more than the limit of {max_bytes} bytes.",
            errors=[
                FieldError(
                    field="helmChart",
                    message=f"the chart archive is {size} bytes, more than {max_bytes}",
                    rule="archive-compressed-size",
                )
            ],
        )
    return ManifestEntry(layer_digest=digest, size=size)


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

    def _policy(self, ref: ChartRef, addresses: Sequence[str]) -> _HostPolicy:
        policy = _HostPolicy(ref.host, self.allowlist, self.insecure, redact_url(ref.url))
        policy.pin(ref, addresses)
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
        policy: _HostPolicy,
    ) -> FetchedChart:
        source = redact_url(ref.url)
        if len(self._schemes) > _MAX_REMEMBERED_HOSTS:
            self._schemes.clear()
        pull = _OciPull(ref, credentials, policy, self.timeout, self._schemes)
        body, manifest_digest = await asyncio.to_thread(pull.manifest, pinned or ref.version)
        if pinned is not None and manifest_digest != pinned:
            raise BadGateway(
                detail=f"Registry {ref.host} returned a manifest hashing to {manifest_digest} "
                f"for the pinned digest {pinned} of chart {source}."
            )
        entry = _parse_manifest(body, source, self.max_bytes)
        async with self.cache.lock(entry.layer_digest):
            path, cached = await asyncio.to_thread(
                self._store_oci, pull, entry, manifest_digest, source
            )
        log.info("chart %s: manifest %s, archive %s", source, manifest_digest, entry.layer_digest)
        return FetchedChart(
            ref, manifest_digest, path, entry.size, entry.layer_digest, cached=cached
        )

    def _store_oci(
        self, pull: _OciPull, entry: ManifestEntry, manifest_digest: str, source: str
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

    def _download_oci(self, pull: _OciPull, entry: ManifestEntry, source: str) -> Path:
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
        policy: _HostPolicy,
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
        policy: _HostPolicy,
        pinned: str | None,
    ) -> tuple[str, int]:
        source = redact_url(ref.url)
        url = f"{policy.scheme_for(ref.host)}://{ref.host}{urlsplit(ref.url).path}"
        session = requests.Session()
        _guard(session, policy, self.timeout)
        tmp = self.cache.staged(".tgz")
        saw_not_found = False
        try:
            for credential in [*credentials, None]:
                auth = (credential.username, credential.password) if credential else None
                try:
                    response = session.get(url, auth=auth, stream=True)
                except requests.RequestException as exc:
                    reason = _plain_http_hint(ref.host) if _speaks_plain_http(exc) else None
                    raise BadGateway(
                        detail=f"Could not reach {ref.host} to download chart {source}: "
                        f"{reason or _short_reason(exc)}."
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
                for chunk in response.iter_content(_CHUNK):
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
                detail=f"Downloading chart {source} failed: {_short_reason(exc)}."
            ) from None
        return "sha256:" + h.hexdigest(), size


__all__ = [
    "HELM_CHART_LAYER",
    "HELM_CONFIG",
    "ChartFetcher",
    "FetchedChart",
    "RegistryCredential",
]
