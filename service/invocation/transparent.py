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
It also answers `POST .../pexec/functions/{fid}[/versions/{vid}]` itself, the hot path of
invocation, with the same handler as the documented route (the router's matching and
dependency machinery cost more than the rest of an invocation).

`FrontDoor` (`NVCF_INVOKE_FRONT_DOOR`) goes one step further: the application hands it the
requests it claims (a pexec POST on its plain path, or a transparent-mode request) before the
framework's own middleware stack, and it answers them through the same request-context
middleware (and tracing) and the same handler. Anything it does not claim (an org alias, a
path with leading `//`) takes the ordinary way, where `TransparentInvocation` answers it.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, cast

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn._types import ASGI3Application, HTTPScope
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from service.core.front import Front, Headers
from service.core.middleware import ROUTE_LABEL
from service.invocation.inline import DECLINED, InlineInvocation
from service.invocation.router import invoke

#: the metrics/log label of transparent-mode requests
LABEL = "<transparent invocation>"
INVOCATION_PREFIXES = ("/v2/nvcf/pexec/", "/v2/nvcf/exec/")
PEXEC = "/v2/nvcf/pexec/functions/"
_PEXEC = PEXEC.encode()
#: a path segment with nothing to unescape: any byte but `/?%#`, spelt as ranges (the
#: regular expression engine checks a negated list byte by byte, a range set by bitmap:
#: a third of the time of the whole match)
_SEGMENT = rb"[\x00-\x22\x24\x26-\x2e\x30-\x3e\x40-\xff]+"
#: a pexec URL with nothing to unescape and no query: (function id, version id or None)
_PLAIN_PEXEC = re.compile(
    re.escape(_PEXEC) + rb"(" + _SEGMENT + rb")(?:/versions/(" + _SEGMENT + rb"))?/*\Z"
).match
#: the route templates the fast path answers for (metrics labels, as the router's)
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


def addressed_by(
    headers: Mapping[bytes, bytes], suffix: str | None
) -> tuple[str, str | None, bool] | None:
    """`addressed`, of headers by name."""
    return _addressed(
        headers.get(b"function-id"),
        headers.get(b"function-version-id"),
        headers.get(b"host", b""),
        suffix,
    )


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


#: what the front door claims of a request from its head: (function id, version id, path)
Claimed = tuple[str, str | None, str]

#: scope key carrying the front door's claim to the end of its chain
_CLAIM = "nvcf.invocation_claim"


class FrontDoor:
    """Invocation requests ahead of the framework's middleware stack.

    `claims(scope)` says whether a request is the front door's; the front door then answers
    it: on the inline path (inline.py) when one is given and the request is its kind, else
    with the request-context middleware (and tracing) put around the invocation handler by
    `wrap`, as they are around the ordinary stack, so the request id, body limit, metrics,
    access log and problems are the same either way."""

    def __init__(
        self,
        *,
        suffix: str | None,
        wrap: Callable[[ASGIApp], ASGIApp],
        inline: Callable[[ASGIApp], InlineInvocation] | None = None,
    ) -> None:
        self.suffix = suffix
        self.app = wrap(self._answer)
        self.inline = inline(self.app) if inline is not None else None

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
        inline = self.inline
        if inline is None or scope.pop(DECLINED, False):
            await self.app(scope, receive, send)
            return
        function_id, version_id, swap = scope[_CLAIM]
        await inline(
            scope,
            receive,
            send,
            function_id=function_id,
            version_id=version_id,
            path=None if swap is None else forwarded_path(scope),
            label=label_of(scope[_CLAIM]),
        )

    # the express lanes (core/server.py, core/front.py), when the inline path is on

    #: the front protocol parses only requests starting so
    head_prefixes = (b"POST " + _PEXEC,)

    def claim_head(self, url: bytes, headers: Headers) -> Claimed | None:
        """A pexec POST on its plain path (no query, nothing escaped) that is not addressed
        by transparent mode: (function id, version id, path)."""
        found = _PLAIN_PEXEC(url)
        if found is None:
            return None
        host = headers.get(b"host", b"")
        maybe = b"function-id" in headers or (len(host) >= 38 and host[36:37] == b".")
        if maybe and addressed_by(headers, self.suffix) is not None:  # (a cheap look first)
            return None
        function_id, version_id = found.groups()
        return (
            function_id.decode("latin-1"),
            None if version_id is None else version_id.decode("latin-1"),
            url.decode("latin-1"),
        )

    def run(self, claimed: object, headers: Headers, body: bytes, front: Front) -> bool:
        assert self.inline is not None
        function_id, version_id, path = cast(Claimed, claimed)
        return self.inline.run_front(
            front,
            headers,
            body,
            function_id=function_id,
            version_id=version_id,
            path=path,
            label=PEXEC_FUNCTION if version_id is None else PEXEC_VERSION,
        )

    def claim(self, scope: HTTPScope) -> bool:
        return self.claims(scope)  # type: ignore[arg-type]

    def start(
        self, cycle: RequestResponseCycle, app: ASGI3Application
    ) -> Coroutine[Any, Any, None] | None:
        assert self.inline is not None
        scope: Scope = cycle.scope  # type: ignore[assignment]
        claimed: Claim = scope[_CLAIM]
        return self.inline.start(
            cycle,
            app,  # type: ignore[arg-type]
            function_id=claimed[0],
            version_id=claimed[1],
            path=None if claimed[2] is None else forwarded_path(scope),
            label=label_of(claimed),
        )

    @staticmethod
    async def _answer(scope: Scope, receive: Receive, send: Send) -> None:
        await answer(scope, receive, send, scope.pop(_CLAIM))
