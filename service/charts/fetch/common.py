"""What the chart fetcher's parts share: media types, sizes, what a pull returns, and how
upstream failures are told (short reasons, the plain-HTTP hint, bounded reads)."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from urllib3.exceptions import MaxRetryError

from service.charts.url import ChartRef
from service.core.errors import BadGateway

# the package's logger, as before the fetcher was cut into modules
log = logging.getLogger("service.charts.fetch")


OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


OCI_INDEX = "application/vnd.oci.image.index.v1+json"


HELM_CONFIG = "application/vnd.cncf.helm.config.v1+json"


HELM_CHART_LAYER = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"


CHUNK = 64 * 1024


MAX_UPSTREAM_TEXT = 300


#: how OpenSSL reports a TLS handshake answered in plain HTTP
PLAIN_HTTP_SIGNS = ("WRONG_VERSION_NUMBER", "wrong version number", "RECORD_LAYER_FAILURE")


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


class Denied(Exception):
    """The registry refused this credential (401/403 or no usable auth challenge)."""


class NotFound(Exception):
    pass


def short_reason(exc: BaseException) -> str:
    """A one-line cause of a transport failure, without object reprs."""
    if isinstance(exc, requests.Timeout):
        return "the connection timed out"
    inner: object = exc.args[0] if exc.args else exc
    if isinstance(inner, MaxRetryError) and inner.reason is not None:
        inner = inner.reason
    text = re.sub(r"<[^>]*object at 0x[0-9a-f]+>:?\s*", "", str(inner)).strip()
    return text[:MAX_UPSTREAM_TEXT] or type(exc).__name__


def speaks_plain_http(exc: BaseException) -> bool:
    """Whether a TLS handshake failed because the server answered in plain HTTP."""
    return isinstance(exc, requests.exceptions.SSLError) and any(
        sign in str(exc) for sign in PLAIN_HTTP_SIGNS
    )


def plain_http_hint(host: str) -> str:
    return (
        f"{host} seems to speak plain HTTP, not HTTPS (the TLS handshake was answered in "
        "plain text); if this registry is meant to be used over plain HTTP, the operator "
        "must list it in NVCF_INSECURE_REGISTRIES"
    )


def upstream_errors(response: requests.Response) -> str:
    """The registry's own error messages from an OCI error body, if any."""
    try:
        body = json.loads(response.content[:65536])
        messages = [
            str(e.get("message", "")) for e in body.get("errors", []) if isinstance(e, dict)
        ]
    except (ValueError, AttributeError, requests.RequestException):
        return ""
    text = "; ".join(m for m in messages if m)
    return f": {text[:MAX_UPSTREAM_TEXT]}" if text else ""


def close_refusal(response: requests.Response, *args: Any, **kwargs: Any) -> None:
    """Release a streamed 401/403 at once: only its status and headers are used, and oras
    drops the challenge response unclosed when answering it fails (token realm unreachable),
    which would leak its connection."""
    if kwargs.get("stream") and response.status_code in (401, 403):
        response.close()


def read_limited(response: requests.Response, limit: int, what: str, source: str) -> bytes:
    chunks: list[bytes] = []
    total = 0
    for chunk in response.iter_content(CHUNK):
        total += len(chunk)
        if total > limit:
            response.close()
            raise BadGateway(
                detail=f"The registry sent a {what} larger than {limit} bytes for chart {source}."
            )
        chunks.append(chunk)
    return b"".join(chunks)
