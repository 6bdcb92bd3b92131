"""Parse the `helmChart` URL (api.md §2.2) and guard its host against SSRF (helm.md §1.1)."""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Collection
from dataclasses import dataclass
from urllib.parse import urlsplit

from service.charts import netguard
from service.charts.netguard import forbidden_reason as forbidden_reason
from service.core.errors import BadGateway, BadRequest, FieldError
from service.core.numbers import natural_in
from service.core.validation import DNS_LABEL_RE

NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
VERSION_RE = re.compile(r"^v?[0-9]+(\.[0-9]+){0,2}$")
_VERSION_START_RE = re.compile(r"^([0-9]|v[0-9])")
# One path component of an OCI repository name (distribution spec).
_REPO_COMPONENT_RE = re.compile(r"^[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*$")
_SCHEMES = ("oci", "https")
_MAX_URL_LENGTH = 2048

_FORMS = (
    "'oci://<registry>/<path>/<name>-<version>.tgz', 'oci://<registry>/<path>/<name>:<version>' "
    "or 'https://<host>/<path>/<name>-<version>.tgz'"
)


@dataclass(frozen=True)
class ChartRef:
    """A syntactically valid chart location."""

    url: str
    scheme: str
    host: str
    hostname: str
    port: int | None
    repository: str
    name: str
    version: str


class ChartUrlError(ValueError):
    """The URL is malformed; `messages` lists every problem, each a full sentence."""

    def __init__(self, messages: list[str]) -> None:
        super().__init__("; ".join(messages))
        self.messages = messages

    def field_errors(self, field: str = "helmChart") -> list[FieldError]:
        return [FieldError(field=field, message=m) for m in self.messages]


def redact_url(url: str) -> str:
    """The URL with any `user:password@` part replaced, safe to quote in messages."""
    scheme_end = url.find("://")
    start = scheme_end + 3 if scheme_end >= 0 else 0
    end = len(url)
    for sep in "/?#":
        i = url.find(sep, start)
        if i >= 0:
            end = min(end, i)
    at = url.rfind("@", start, end)
    if at < 0:
        return url
    return url[:start] + "***@" + url[at + 1 :]


def _check_name(name: str, where: str) -> list[str]:
    if NAME_RE.match(name):
        return []
    if "_" in name:
        return [
            f"Chart name '{name}' in {where} contains '_': underscores are not allowed in "
            "chart names; use lowercase letters, digits and '-'."
        ]
    if name != name.lower() and NAME_RE.match(name.lower()):
        return [f"Chart name '{name}' in {where} must be lowercase."]
    return [
        f"Chart name '{name}' in {where} is invalid: it must match "
        "^[a-z0-9]([a-z0-9-]*[a-z0-9])?$ (lowercase letters, digits and '-', starting and "
        "ending with a letter or digit)."
    ]


def _check_version(version: str, where: str) -> list[str]:
    if "-" in version:
        return [
            f"Chart version '{version}' in {where} contains '-': chart versions may not contain "
            "'-', because '-' separates the chart name from the version in "
            "'<name>-<version>.tgz' and would mark a SemVer pre-release; use a version such as "
            "'1.0.0' or 'v1'."
        ]
    if VERSION_RE.match(version):
        return []
    return [
        f"Chart version '{version}' in {where} is invalid: it must be one to three "
        "dot-separated numbers with an optional leading 'v', such as '1.0.0', '1.2' or 'v1'."
    ]


def _split_file_name(base: str, where: str) -> tuple[str, str, list[str]]:
    """Split `<name>-<version>` at the last part that starts with a digit or `v<digit>`."""
    parts = base.split("-")
    for i in range(len(parts) - 1, 0, -1):
        if _VERSION_START_RE.match(parts[i]):
            return "-".join(parts[:i]), "-".join(parts[i:]), []
    if _VERSION_START_RE.match(parts[0]):
        return (
            "",
            base,
            [
                f"Chart file name '{base}.tgz' in {where} has no chart name before "
                "the version; expected '<name>-<version>.tgz'."
            ],
        )
    return (
        "",
        "",
        [
            f"Chart file name '{base}.tgz' in {where} has no version: expected "
            "'<name>-<version>.tgz' where the version starts with a digit or 'v<digit>', "
            "such as 'inference-test-1.0.0.tgz'."
        ],
    )


def _check_host(netloc: str, where: str) -> tuple[str, int | None, list[str]]:
    """Validate `host[:port]`; returns the bare hostname (IPv6 without brackets) and port."""
    errors: list[str] = []
    port: int | None = None
    if netloc.startswith("["):
        close = netloc.find("]")
        if close < 0:
            return "", None, [f"Host '{netloc}' in {where} has an unterminated IPv6 '['."]
        hostname = netloc[1:close]
        rest = netloc[close + 1 :]
        try:
            ipaddress.IPv6Address(hostname)
        except ValueError:
            errors.append(f"Host '{netloc}' in {where} is not a valid IPv6 address.")
    else:
        hostname, sep, rest = netloc.partition(":")
        rest = sep + rest
        if not hostname:
            errors.append(f"The URL {where} has no registry host.")
        elif not _valid_hostname(hostname):
            errors.append(f"Host '{hostname}' in {where} is not a valid host name or IPv4 address.")
    if rest:
        port_text = rest[1:] if rest.startswith(":") else rest
        number = natural_in(port_text, 1, 65535) if rest.startswith(":") else None
        if number is None:
            shown = port_text if len(port_text) <= 12 else port_text[:12] + "…"
            errors.append(f"Port '{shown}' in {where} must be a number from 1 to 65535.")
        else:
            port = number
    return hostname, port, errors


def _valid_hostname(hostname: str) -> bool:
    if len(hostname) > 253:
        return False
    labels = hostname.rstrip(".").split(".") if hostname != "." else [""]
    return all(DNS_LABEL_RE.match(label) for label in labels)


def parse_chart_url(url: str) -> ChartRef:
    """Check `url` syntactically (no DNS); raise ChartUrlError listing every problem."""
    if not isinstance(url, str) or not url.strip():
        raise ChartUrlError([f"The helmChart URL is empty; expected {_FORMS}."])
    shown = redact_url(url)
    where = f"'{shown}'"
    if len(url) > _MAX_URL_LENGTH:
        raise ChartUrlError(
            [
                f"The helmChart URL is {len(url)} characters long; at most {_MAX_URL_LENGTH} "
                "are allowed."
            ]
        )
    if url != url.strip() or any(c.isspace() or ord(c) < 0x20 for c in url):
        raise ChartUrlError([f"The helmChart URL {where} must not contain whitespace."])
    if "://" not in url:
        raise ChartUrlError([f"The helmChart URL {where} has no scheme; expected {_FORMS}."])

    errors: list[str] = []
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ChartUrlError([f"The helmChart URL {where} cannot be parsed: {exc}."]) from None
    scheme = parts.scheme.lower()
    if scheme not in _SCHEMES:
        errors.append(
            f"Scheme '{parts.scheme}' of {where} is not allowed: only 'oci' and 'https' are "
            "accepted (plain http is used only for registries configured as insecure)."
        )
    netloc = parts.netloc
    if "@" in netloc:
        errors.append(
            f"The helmChart URL {where} contains user information ('user:password@'), which is "
            "not allowed; store registry credentials with /v2/nvcf/registry-credentials instead."
        )
        netloc = netloc.rsplit("@", 1)[1]
    if parts.query or url.rstrip("#").endswith("?"):
        errors.append(f"The helmChart URL {where} must not contain a query string ('?...').")
    if parts.fragment or "#" in url:
        errors.append(f"The helmChart URL {where} must not contain a fragment ('#...').")
    host = netloc.lower()
    hostname, port, host_errors = _check_host(host, where)
    errors += host_errors

    path = parts.path
    segments = path.split("/")[1:] if path.startswith("/") else []
    name = version = ""
    dirs: list[str] = []
    if not segments or segments == [""]:
        errors.append(
            f"The helmChart URL {where} has no chart path after the host; expected {_FORMS}."
        )
    else:
        dirs, last = segments[:-1], segments[-1]
        for seg in dirs:
            if seg in ("", ".", ".."):
                errors.append(
                    f"The path of {where} has an empty, '.' or '..' segment; each segment "
                    "must be a repository path component."
                )
                break
            if not _REPO_COMPONENT_RE.match(seg):
                errors.append(
                    f"Repository path segment '{seg}' in {where} is invalid: it must be "
                    "lowercase letters and digits, optionally separated by '.', '_', '__' or '-'."
                )
        if "@" in last:
            errors.append(
                f"The helmChart URL {where} uses a digest ('@'); give a version tag instead "
                "(the manifest digest is recorded automatically)."
            )
        elif ":" in last and scheme != "https":
            name, _, version = last.partition(":")
            if not name:
                errors.append(f"The helmChart URL {where} has no chart name before ':'.")
            if not version:
                errors.append(f"The helmChart URL {where} has no version after ':'.")
        elif last.endswith(".tgz"):
            name, version, split_errors = _split_file_name(last[: -len(".tgz")], where)
            errors += split_errors
        elif scheme == "https":
            errors.append(
                f"The helmChart URL {where} must end with '<name>-<version>.tgz' for an https "
                "chart repository archive."
            )
        else:
            errors.append(
                f"The helmChart URL {where} must end with '<name>-<version>.tgz' or "
                "'<name>:<version>'."
            )
        if name:
            errors += _check_name(name, where)
        if version:
            errors += _check_version(version, where)

    if errors:
        raise ChartUrlError(errors)
    return ChartRef(
        url=url,
        scheme=scheme,
        host=host,
        hostname=hostname,
        port=port,
        repository="/".join([*dirs, name]),
        name=name,
        version=version,
    )


# --- SSRF guard -------------------------------------------------------------------------------


def host_listed(ref: ChartRef, hosts: Collection[str]) -> bool:
    """Whether `host[:port]` or the bare hostname is in a configured host list."""
    listed = {h.strip().lower() for h in hosts if h.strip()}
    return ref.host in listed or ref.hostname in listed or f"[{ref.hostname}]" in listed


async def _resolve(hostname: str, port: int) -> list[str]:
    # looked up on each call, so that substituting netguard.resolve covers this lookup too
    return await asyncio.to_thread(netguard.resolve, hostname, port)


async def check_host(ref: ChartRef, allowlist: Collection[str]) -> list[str]:
    """Refuse hosts resolving to non-public addresses unless allow-listed.

    Returns the resolved addresses (empty for allow-listed hosts, which are not resolved); the
    fetcher connects to exactly these, never resolving the name again (DNS rebinding).
    """
    if host_listed(ref, allowlist):
        return []
    port = ref.port or 443
    try:
        addresses = list(await _resolve(ref.hostname, port))
    except socket.gaierror as exc:
        if exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
            raise BadRequest(
                detail=f"The host '{ref.host}' of chart {redact_url(ref.url)} does not resolve "
                "to any address."
            ) from None
        raise BadGateway(
            detail=f"Could not resolve the host '{ref.host}' of chart {redact_url(ref.url)}: "
            f"{exc.strerror or exc}."
        ) from None
    if not addresses:
        raise BadRequest(
            detail=f"The host '{ref.host}' of chart {redact_url(ref.url)} does not resolve to "
            "any address."
        )
    for address in addresses:
        reason = forbidden_reason(address)
        if reason is not None:
            raise BadRequest(
                detail=f"The host '{ref.host}' of chart {redact_url(ref.url)} resolves to the "
                f"{reason} address {address}; charts are only pulled from public addresses "
                f"unless '{ref.host}' is in NVCF_REGISTRY_ALLOWLIST.",
                errors=[
                    FieldError(
                        field="helmChart",
                        message=f"host '{ref.host}' resolves to {reason} address {address}",
                    )
                ],
            )
    return addresses
