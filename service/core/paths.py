"""The path a request's routes are matched on, made once per request by the application
ahead of its routers (the invocation entry's and FastAPI's) and their middleware: a leading
`//` collapsed, an org alias (`/v2/orgs/{org}[/teams/{team}]/nvcf/...`) cut."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote, unquote

from starlette.types import Scope


@dataclass(frozen=True)
class OrgAlias:
    """An org-aliased path cut apart: the org, the team and the `/v2/nvcf/...` path it
    stands for, still encoded as the client sent it."""

    org: str
    team: str | None
    raw: bytes


def org_alias(raw: bytes) -> OrgAlias | None:
    """The one grammar of `/v2/orgs/{org}[/teams/{team}]/nvcf/...`, read on the path as the
    client encoded it: an encoded `/` (`B%2Fnvcf`) is part of a segment, never a separator."""
    parts = raw.split(b"/", 8)
    # ["", "v2", "orgs", org, "nvcf", ...] or ["", "v2", "orgs", org, "teams", team, "nvcf", ...]
    if len(parts) >= 5 and parts[1:3] == [b"v2", b"orgs"] and parts[4] == b"nvcf" and parts[3]:
        org, team, rest = parts[3], None, parts[5:]
    elif (
        len(parts) >= 7
        and parts[1:3] == [b"v2", b"orgs"]
        and parts[4] == b"teams"
        and parts[6] == b"nvcf"
        and parts[3]
        and parts[5]
    ):
        org, team, rest = parts[3], parts[5], parts[7:]
    else:
        return None
    return OrgAlias(
        org=unquote(org.decode("latin-1")),
        team=None if team is None else unquote(team.decode("latin-1")),
        raw=b"/v2/nvcf" + (b"/" + b"/".join(rest) if rest else b""),
    )


def raw_path(scope: Scope) -> bytes:
    """The path as the client encoded it."""
    path: str = scope["path"]
    return scope.get("raw_path") or quote(path).encode("ascii")


def normalize(scope: Scope) -> None:
    """Give an HTTP request its own state and the path its routes are matched on: once per
    request, by the application ahead of its routers (the invocation entry's and FastAPI's)
    and their middleware.

    `//v2/nvcf/...` is served as `/v2/nvcf/...` (what a client sends when it joins a base URL
    ending in '/' with a path starting with one), and `/v2/orgs/{org}[/teams/{team}]/nvcf/...`
    by the `/v2/nvcf/...` routes (`rewrite_org_alias`).
    """
    # A fresh per-request state (servers may hand every request the same lifespan dict).
    scope["state"] = dict(scope.get("state") or {})
    path: str = scope["path"]
    if path.startswith("//"):
        scope["path"] = "/" + path.lstrip("/")
        raw: bytes | None = scope.get("raw_path")
        if raw is not None:
            scope["raw_path"] = b"/" + raw.lstrip(b"/")
    rewrite_org_alias(scope)


def rewrite_org_alias(scope: Scope) -> None:
    """Serve `/v2/orgs/{org}[/teams/{team}]/nvcf/...` by the `/v2/nvcf/...` routes.

    The alias is cut from the path as the client encoded it (`org_alias`); the decoded path is
    derived from the result, as the server derives it. The org (and team) go into the request
    state for the org check; the encoded path as sent is kept (`original_path`) for error
    bodies, logs and transparent mode, which forwards it to the worker: a decoded path there
    would put the client's `%0D%0A` into the worker's request line.
    """
    path: str = scope["path"]
    if not path.startswith("/v2/orgs/"):
        return
    raw = raw_path(scope)
    alias = org_alias(raw)
    if alias is None:
        return
    state = scope.setdefault("state", {})
    state["org"] = alias.org
    state["team"] = alias.team
    state["original_path"] = raw.decode("latin-1")
    scope["raw_path"] = alias.raw
    scope["path"] = unquote(alias.raw.decode("latin-1"))
