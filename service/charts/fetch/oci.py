"""The OCI client of the chart fetcher (oras-py): one chart's manifest and layer pulled with the
account's credentials then anonymously, and the tags shown when a version is not found."""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import NoReturn
from urllib.parse import urlsplit

import oras.provider
import requests

from service.charts.cache import DIGEST_RE, ManifestEntry
from service.charts.fetch.common import (
    CHUNK,
    HELM_CHART_LAYER,
    HELM_CONFIG,
    OCI_INDEX,
    OCI_MANIFEST,
    Denied,
    NotFound,
    RegistryCredential,
    close_refusal,
    plain_http_hint,
    read_limited,
    short_reason,
    speaks_plain_http,
    upstream_errors,
)
from service.charts.netguard import (
    HostPolicy,
    guard,
)
from service.charts.url import ChartRef, redact_url
from service.core.errors import BadGateway, BadRequest, FieldError

# the package's logger, as before the fetcher was cut into modules
log = logging.getLogger("service.charts.fetch")


MAX_MANIFEST_BYTES = 4 * 1024 * 1024


#: "chart not found" lists at most this many of the repository's tags ...
MAX_TAGS_SHOWN = 20


#: ... from one page of the OCI tags list of at most this many tags and bytes
_TAGS_PAGE = 1000


_MAX_TAGS_BYTES = 256 * 1024


#: an OCI tag (distribution spec); anything else a registry lists is not shown
_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")


# oras' do_request sleeps and retries up to five times on any error; callers here want one
# attempt and a prompt 502, so use the undecorated method (oras' own auth handling stays).
_DO_REQUEST: Callable[..., requests.Response] = getattr(
    oras.provider.Registry.do_request, "__wrapped__", oras.provider.Registry.do_request
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


class OciPull:
    """Blocking OCI pull steps for one chart; run in a worker thread."""

    def __init__(
        self,
        ref: ChartRef,
        credentials: Sequence[RegistryCredential],
        policy: HostPolicy,
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
                f"{self.ref.host} to pull chart {self.source}: {short_reason(exc)}."
            )
        reason = plain_http_hint(self.ref.host) if speaks_plain_http(exc) else None
        return BadGateway(
            detail=f"Could not reach registry {self.ref.host} to pull chart {self.source}: "
            f"{reason or short_reason(exc)}."
        )

    def _status_error(self, response: requests.Response, what: str) -> BadGateway:
        return BadGateway(
            detail=f"Registry {self.ref.host} answered {response.status_code} "
            f"{response.reason or ''}".rstrip()
            + f" to the {what} request for chart {self.source}{upstream_errors(response)}."
        )

    def _new_registry(self, backend: str) -> oras.provider.Registry:
        registry = oras.provider.Registry(
            hostname=self.ref.host, insecure=self.insecure, auth_backend=backend
        )
        guard(registry.session, self.policy, self.timeout)
        registry.session.hooks["response"].append(close_refusal)
        return registry

    def _challenge(self) -> str:
        """Ping /v2/ as Docker does: 'basic', 'bearer' or 'none' (anonymous API access)."""
        session = requests.Session()
        guard(session, self.policy, self.timeout)
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
            raise Denied from exc
        if response.status_code in (401, 403):
            response.close()
            raise Denied
        if response.status_code == 404:
            response.close()
            raise NotFound
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
            except Denied:
                continue
            except NotFound:
                saw_not_found = True
                self._not_found_with = (registry, self.anonymous_basic)
                continue
            with response:
                if response.status_code != 200:
                    raise self._status_error(response, "manifest")
                body = read_limited(response, MAX_MANIFEST_BYTES, "manifest", self.source)
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
        except NotFound:
            return _Tags([], repository_missing=True)
        except (Denied, BadGateway):
            return None
        try:
            with response:
                if response.status_code != 200:
                    return None
                body = read_limited(response, _MAX_TAGS_BYTES, "tag list", self.source)
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
        except Denied:
            raise BadRequest(
                detail=f"no credential was valid to pull chart {self.source}"
            ) from None
        except NotFound:
            raise BadRequest(detail=f"chart {self.source} not found") from None
        digest = hashlib.sha256()
        received = 0
        try:
            with response, target.open("wb") as out:
                if response.status_code != 200:
                    raise self._status_error(response, "chart download")
                for chunk in response.iter_content(CHUNK):
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


def parse_manifest(body: bytes, source: str, max_bytes: int) -> ManifestEntry:
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
