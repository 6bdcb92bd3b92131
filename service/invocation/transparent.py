"""Transparent mode, as nvcf-cli and NVCF's invocation service use it: a request addressed to
a function by its Host or by routing headers is forwarded, path and query unchanged, to the
function's worker — whatever the path and method.

- headers `function-id` (and optionally `function-version-id`), both UUIDs; else
- `Host: <functionId>[.<versionId>].<suffix>[:port]`: the first label a UUID, then optionally
  a second UUID, then at least one more label, which must equal `NVCF_INVOKE_HOST_SUFFIX` when
  it is set. Two UUIDs are tried as function.version first, then in NVCF's own order
  (version.function).

The middleware sits inside the request-context middleware (request ids, the body limit,
metrics and the access log apply) and before routing: such a request never reaches a route.
It also answers `POST .../pexec/functions/{fid}[/versions/{vid}]` itself, with the same
handler as the documented route.

`FrontDoor` (`NVCF_INVOKE_FRONT_DOOR`): the application hands it the requests it claims (a
pexec POST on its plain path, or a transparent-mode request) before the framework's own
middleware stack, and it answers them through the same request-context middleware (and
tracing) and the same handler. Anything it does not claim (an org alias, a path with leading
`//`) takes the ordinary way, where `TransparentInvocation` answers it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from service.core.middleware import ROUTE_LABEL
from service.invocation.router import invoke

#: the metrics/log label of transparent-mode requests
LABEL = "<transparent invocation>"
INVOCATION_PREFIXES = ("/v2/nvcf/pexec/", "/v2/nvcf/exec/")
PEXEC = "/v2/nvcf/pexec/functions/"
#: the route templates of pexec (metrics labels, as the router's)
PEXEC_FUNCTION = "/v2/nvcf/pexec/functions/{functionId}"
PEXEC_VERSION = "/v2/nvcf/pexec/functions/{functionId}/versions/{functionVersionId}"


def pexec_ids(scope: Scope) -> tuple[str, str | None] | None:
    """(function id, version id) of a `POST` to a pexec route, else None."""
    path: str = scope.get("path", "")
    if scope.get("method") != "POST" or not path.startswith(PEXEC):
        return None
    parts = path[len(PEXEC) :].rstrip("/").split("/")
    if len(parts) == 1 and parts[0]:
        return parts[0], None
    if len(parts) == 3 and parts[1] == "versions" and parts[0] and parts[2]:
        return parts[0], parts[2]
    return None


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


def body_limit(suffix: str | None, limit: int) -> Callable[[Scope], int | None]:
    """For the request-context middleware: `limit` for invocation requests, else None."""

    def of(scope: Scope) -> int | None:
        if scope.get("type") != "http":
            return None
        if str(scope.get("path", "")).startswith(INVOCATION_PREFIXES):
            return limit
        return limit if addressed(scope["headers"], suffix) is not None else None

    return of


#: (function id, version id, swap) of a transparent-mode request, or the ids of a pexec POST
Claim = tuple[str, str | None, bool | None]


def claim(scope: Scope, suffix: str | None) -> Claim | None:
    """What an invocation request addresses (transparent mode first, as it takes precedence
    over the path); None for any other request. `swap` is None for a pexec POST."""
    target = addressed(scope["headers"], suffix)
    if target is not None:
        return target
    ids = pexec_ids(scope)
    return None if ids is None else (ids[0], ids[1], None)


def forwarded_path(scope: Scope) -> str:
    """The path (and query) a transparent-mode request goes to the worker with."""
    state = scope.get("state") or {}
    path = state.get("original_path") or scope.get("raw_path", b"").decode("latin-1")
    path = path or scope.get("path", "/")
    if scope.get("query_string"):
        path += "?" + scope["query_string"].decode("latin-1")
    return str(path)


def label_of(claimed: Claim) -> str:
    """The metrics/log route label of a claimed request."""
    if claimed[2] is None:
        return PEXEC_FUNCTION if claimed[1] is None else PEXEC_VERSION
    return LABEL


async def answer(scope: Scope, receive: Receive, send: Send, claimed: Claim) -> None:
    """Answer a claimed invocation request with the invocation handler."""
    function_id, version_id, swap = claimed
    scope[ROUTE_LABEL] = label_of(claimed)
    request = Request(scope, receive)
    if swap is None:
        response = await invoke(request, function_id, version_id)
    else:
        path = forwarded_path(scope)
        response = await invoke(request, function_id, version_id, path=path, swap_ids=swap)
    await response(scope, receive, send)


class TransparentInvocation:
    def __init__(self, app: ASGIApp, *, suffix: str | None) -> None:
        self.app = app
        self.suffix = suffix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        claimed = claim(scope, self.suffix)
        if claimed is None:
            await self.app(scope, receive, send)
            return
        await answer(scope, receive, send, claimed)


#: scope key carrying the front door's claim to the end of its chain
_CLAIM = "nvcf.invocation_claim"


class FrontDoor:
    """Invocation requests ahead of the framework's middleware stack.

    `claims(scope)` says whether a request is the front door's; the front door then answers
    it with the request-context middleware (and tracing) put around the invocation handler by
    `wrap`, as they are around the ordinary stack, so the request id, body limit, metrics,
    access log and problems are the same either way."""

    def __init__(self, *, suffix: str | None, wrap: Callable[[ASGIApp], ASGIApp]) -> None:
        self.suffix = suffix
        self.app = wrap(self._answer)

    def claims(self, scope: Scope) -> bool:
        path: str = scope["path"]
        if path.startswith("//") or path.startswith("/v2/orgs/"):
            return False  # rewritten by the request-context middleware: the ordinary way
        claimed = claim(scope, self.suffix)
        if claimed is None:
            return False
        scope[_CLAIM] = claimed
        return True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)

    @staticmethod
    async def _answer(scope: Scope, receive: Receive, send: Send) -> None:
        await answer(scope, receive, send, scope.pop(_CLAIM))
