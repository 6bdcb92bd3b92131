"""Transparent mode, as nvcf-cli and NVCF's invocation service use it: a request addressed to
a function by its Host or by routing headers is forwarded, path and query unchanged, to the
function's worker — whatever the path and method.

- headers `function-id` (and optionally `function-version-id`), both UUIDs; else
- `Host: <functionId>[.<versionId>].<suffix>[:port]`: the first label a UUID, then optionally
  a second UUID, then at least one more label, which must equal `NVCF_INVOKE_HOST_SUFFIX` when
  it is set. Two UUIDs are tried as function.version first, then in NVCF's own order
  (version.function).

Such a request takes precedence over the path: the HTTP entry (http.py) claims it whatever
route its path would match. A request giving any of these headers (or `Host`) more than once is
refused (`repeated`): which of two to believe is ambiguous (RFC 9112 §3.2 for Host).
"""

from __future__ import annotations

import uuid

from starlette.types import Scope

#: the headers that address a request (here and on the LLM host): each at most once
ADDRESSING = (b"host", b"function-id", b"function-version-id")


def _uuid(text: str) -> str | None:
    if len(text) != 36:
        return None
    try:
        return str(uuid.UUID(text))
    except ValueError:
        return None


def addressed(
    headers: list[tuple[bytes, bytes]], suffix: str | None
) -> tuple[str, str | None, bool] | None:
    """(function id, version id, whether the two ids may be swapped) of a transparent-mode
    request; None for any other request."""
    host = b""
    function_id = version_id = None
    for name, value in headers:
        if name == b"function-id":
            function_id = value
        elif name == b"function-version-id":
            version_id = value
        elif name == b"host":
            host = value
    return _addressed(function_id, version_id, host, suffix)


def repeated(headers: list[tuple[bytes, bytes]]) -> list[str]:
    """The addressing headers the request gives more than once (none: it may be routed)."""
    seen: set[bytes] = set()
    twice: list[str] = []
    for name, _ in headers:
        if name in ADDRESSING:
            if name in seen and name.decode() not in twice:
                twice.append(name.decode())
            seen.add(name)
    return twice


def addressing(
    headers: list[tuple[bytes, bytes]], suffix: str | None
) -> tuple[tuple[str, ...], tuple[str, str | None, bool] | None]:
    """What the HTTP entry reads of a request's addressing headers, in one call: those given
    more than once (`repeated`) and what it is addressed to (`addressed`)."""
    return tuple(repeated(headers)), addressed(headers, suffix)


def _addressed(
    function_id: bytes | None, version_id: bytes | None, host: bytes, suffix: str | None
) -> tuple[str, str | None, bool] | None:
    if function_id is not None:
        fid = _uuid(function_id.decode("latin-1").strip())
        if fid is not None:
            vid = _uuid(version_id.decode("latin-1").strip()) if version_id else None
            return fid, vid, False
    if len(host) < 38 or host[36:37] != b".":
        return None  # no UUID label first and a suffix after it (the common case: at once)
    text = host.decode("latin-1")
    hostname = text.rsplit(":", 1)[0] if ":" in text else text
    labels = hostname.lower().rstrip(".").split(".")
    first = _uuid(labels[0])
    if first is None:
        return None
    second = _uuid(labels[1]) if len(labels) > 2 else None
    rest = labels[2:] if second is not None else labels[1:]
    if not rest or (suffix is not None and ".".join(rest) != suffix):
        return None
    return first, second, second is not None


def forwarded_path(scope: Scope) -> str:
    """The path (and query) a transparent-mode request goes to the worker with."""
    state = scope.get("state") or {}
    path = state.get("original_path") or scope.get("raw_path", b"").decode("latin-1")
    path = path or scope.get("path", "/")
    if scope.get("query_string"):
        path += "?" + scope["query_string"].decode("latin-1")
    return str(path)
