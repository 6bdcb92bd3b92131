"""What goes to the worker and what comes back: headers in both directions, the path.

To the worker: the caller's headers minus hop-by-hop ones (and those its `Connection` header
names), `Host`, `Content-Length`, `Expect` and the caller's `Authorization` (an NVCF
credential, never the function's business); plus the NVCF-* headers a worker reads (NVCF's
documented container variables), which replace any the caller sent. Back to the caller: the
worker's headers minus hop-by-hop ones, `Date` and `Server` (the server adds its own), and any
NVCF-REQID / NVCF-STATUS / X-Request-Id (the invocation plane sets those).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from urllib.parse import quote

from service.backends.worker import HOP_BY_HOP_BYTES, connection_header_names
from service.core.numbers import natural

#: request headers never forwarded (besides hop-by-hop ones)
_DROP_REQUEST = frozenset({"host", "content-length", "expect", "authorization"})
#: response headers the invocation plane writes itself (`x-request-id`: the request-context
#: middleware's)
_DROP_RESPONSE = frozenset(
    {
        "date",
        "server",
        "nvcf-reqid",
        "nvcf-status",
        "content-length",
        "nvcf-worker-utils-result",
        "x-request-id",
    }
)
#: the NVCF-* headers the invocation plane sets on the worker request
NVCF_REQUEST_HEADERS = frozenset(
    {
        "nvcf-reqid",
        "nvcf-sub",
        "nvcf-ncaid",
        "nvcf-function-name",
        "nvcf-function-id",
        "nvcf-function-version-id",
        "nvcf-instance-id",
        "nvcf-max-response-size-bytes",
        "nvcf-backend",
        "nvcf-instancetype",
        "nvcf-region",
        "nvcf-invocation-region",
        # the worker's files (service/assets/): set by the engine, never by the caller
        "nvcf-asset-dir",
        "nvcf-large-output-dir",
        "nvcf-function-asset-ids",
        "nvcf-input-asset-references",
        # the worker-utils sidecar's (service/assets/worker_utils.py)
        "nvcf-worker-utils",
        "nvcf-worker-utils-progress",
        "nvcf-worker-utils-result",
    }
)


_ALWAYS_DROPPED = _DROP_REQUEST | NVCF_REQUEST_HEADERS
#: header names (lower-cased) never forwarded, whatever `Connection` says
_REQUEST_DROPPED = HOP_BY_HOP_BYTES | frozenset(name.encode() for name in _ALWAYS_DROPPED)
_RESPONSE_DROPPED = HOP_BY_HOP_BYTES | frozenset(name.encode() for name in _DROP_RESPONSE)


#: printable ASCII but the space, any number of them
_PRINTABLE = re.compile(r"[!-~]*")


def request_target_safe(target: str) -> bool:
    """Whether a path (and query) can be a worker request line's target as it is: printable
    ASCII only, no space. Anything else would be decoded text the client escaped."""
    return _PRINTABLE.fullmatch(target) is not None


def worker_request_headers(
    raw: Iterable[tuple[bytes, bytes]], extra: Sequence[tuple[str, str]] = ()
) -> list[tuple[str, str]]:
    """The caller's headers a worker receives (filtered), then the entry's `extra` ones."""
    items = raw if isinstance(raw, list) else list(raw)
    drop = _REQUEST_DROPPED
    for name, _ in items:
        if name.lower() == b"connection":
            listed = b",".join([v for k, v in items if k.lower() == b"connection"])
            drop = _dropped(_REQUEST_DROPPED, listed)
            break
    out = []
    for name, value in items:
        key = name.lower()
        # `nvcf_ncaid` is NVCF-NCAID to a CGI/WSGI worker (HTTP_NVCF_NCAID): an underscore
        # spelling of a dropped name is dropped too, as nginx and Envoy do for such names
        if key in drop or (b"_" in key and key.replace(b"_", b"-") in drop):
            continue
        out.append((name.decode("latin-1"), value.decode("latin-1")))
    out.extend(extra)
    return out


def header_text(value: str) -> str:
    """`value` as it may stand in an HTTP header: printable ASCII as it is, anything else (a
    line break, another control character, non-ASCII text such as a token's subject)
    percent-encoded, so that no value can end its line or fail to encode."""
    if value.isascii() and value.isprintable():
        return value
    return quote(value, safe=" !#$&'()*+,-./:;<=>?@[]^_`{|}~")


def caller_headers(
    worker: Sequence[tuple[bytes, bytes]],
) -> tuple[list[tuple[bytes, bytes]], int | None]:
    """The worker's response headers the caller gets (names lower-cased; no hop-by-hop ones,
    none its `Connection` header lists, no Date, Server, NVCF-REQID, NVCF-STATUS, X-Request-Id
    or Content-Length) and the worker's Content-Length (None: it sent none)."""
    drop = _RESPONSE_DROPPED
    for name, _ in worker:
        if name.lower() == b"connection":
            listed = b",".join([v for k, v in worker if k.lower() == b"connection"])
            drop = _dropped(_RESPONSE_DROPPED, listed)
            break
    kept = []
    length: int | None = None
    for name, value in worker:
        lowered = name.lower()
        if lowered not in drop:
            kept.append((lowered, value))
        elif lowered == b"content-length" and length is None:
            length = natural(value)
    return kept, length


@functools.lru_cache(maxsize=64)
def _dropped(always: frozenset[bytes], connection: bytes) -> frozenset[bytes]:
    """`always` and the header names a `Connection` header value lists (lower-cased)."""
    return always | connection_header_names([(b"connection", connection)])
