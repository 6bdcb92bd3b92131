"""Which wire serves each provider, what it carries, and where its endpoint points.

- OTLP (HTTP or gRPC): OTEL_COLLECTOR and GRAFANA_CLOUD (basic auth `instanceId:token`);
  logs, metrics and traces.
- Prometheus remote write (HTTP): PROMETHEUS, VICTORIAMETRICS, KRATOS_THANOS (Thanos
  receive); metrics.
- Datadog's intake APIs (HTTP): DATADOG, by site name (`datadoghq.com`, `us3.datadoghq.com`,
  ...) or an intake URL; logs and metrics on its own APIs, traces on its OTLP traces intake
  (its native trace intake has no well-kept encoder outside its tracer's private modules).

The other providers NVCF names have no wire here and are refused at creation, saying which
are supported. An endpoint is a request a tenant aims at the platform's network: its host is
resolved and each address checked as chart pulls check theirs (charts/netguard.py), unless
the operator lists it in `NVCF_TELEMETRY_ALLOWLIST`.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Collection
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import urlsplit

from service.charts.netguard import default_port, forbidden_reason, resolve
from service.observability.models import Kind, Protocol, Provider


class Wire(StrEnum):
    OTLP = "OTLP"
    REMOTE_WRITE = "REMOTE_WRITE"
    DATADOG = "DATADOG"


@dataclass(frozen=True)
class WireRules:
    providers: tuple[Provider, ...]
    protocols: tuple[Protocol, ...]
    kinds: tuple[Kind, ...]


WIRES: dict[Wire, WireRules] = {
    Wire.OTLP: WireRules(
        (Provider.OTEL_COLLECTOR, Provider.GRAFANA_CLOUD),
        (Protocol.HTTP, Protocol.GRPC),
        (Kind.LOGS, Kind.METRICS, Kind.TRACES),
    ),
    Wire.REMOTE_WRITE: WireRules(
        (Provider.PROMETHEUS, Provider.VICTORIAMETRICS, Provider.KRATOS_THANOS),
        (Protocol.HTTP,),
        (Kind.METRICS,),
    ),
    Wire.DATADOG: WireRules(
        (Provider.DATADOG,), (Protocol.HTTP,), (Kind.LOGS, Kind.METRICS, Kind.TRACES)
    ),
}
SUPPORTED: tuple[Provider, ...] = tuple(p for r in WIRES.values() for p in r.providers)
#: Datadog's sites (its documentation's list), given by name as NVCF's docs show
DATADOG_SITES = (
    "datadoghq.com",
    "us3.datadoghq.com",
    "us5.datadoghq.com",
    "datadoghq.eu",
    "ap1.datadoghq.com",
    "ddog-gov.com",
)


def wire_of(provider: Provider) -> Wire | None:
    return next((w for w, r in WIRES.items() if provider in r.providers), None)


def _names(values: Collection[StrEnum]) -> str:
    return ", ".join(v.value for v in values)


def wire_problems(
    provider: Provider, protocol: Protocol, kinds: list[Kind]
) -> list[tuple[str, str]]:
    """(field, message) of every way the provider's wire refuses this protocol or these types."""
    wire = wire_of(provider)
    if wire is None:
        return [
            (
                "provider",
                f"{provider.value} is not supported by this server; the supported providers "
                f"are {_names(SUPPORTED)}",
            )
        ]
    rules = WIRES[wire]
    problems: list[tuple[str, str]] = []
    if protocol not in rules.protocols:
        problems.append(
            ("protocol", f"{provider.value} is sent over {_names(rules.protocols)}, not {protocol}")
        )
    for kind in kinds:
        if kind not in rules.kinds:
            problems.append(
                ("types", f"{provider.value} receives {_names(rules.kinds)}, not {kind.value}")
            )
    return problems


@dataclass(frozen=True)
class Target:
    """Where an endpoint points: the URL exported to, and the host and port checked."""

    url: str
    host: str
    port: int
    #: a Datadog site by name: one of Datadog's own public hosts, not checked
    site: bool = False


def target_of(provider: Provider, endpoint: str) -> tuple[Target | None, str | None]:
    """The endpoint's target, or why it is not one."""
    text = endpoint.strip()
    if provider is Provider.DATADOG and text.lower() in DATADOG_SITES:
        site = text.lower()
        return Target(f"https://api.{site}", f"api.{site}", 443, site=True), None
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        return None, f"is not a URL: {exc}"
    sites = (
        f", or a Datadog site ({', '.join(DATADOG_SITES)})" if provider is Provider.DATADOG else ""
    )
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None, f"must be an http:// or https:// URL with a host{sites}"
    if parts.username is not None or parts.password is not None:
        return None, "must not hold a user name or password: the key goes in secret.value"
    if parts.query or parts.fragment:
        return None, "must not have a query or a fragment"
    host = parts.hostname
    return Target(text, host, port or default_port(parts.scheme)), None


def allowed_by(allowlist: Collection[str], host: str, port: int) -> bool:
    """Whether the operator lists `host` or `host:port` (as NVCF_REGISTRY_ALLOWLIST does)."""
    bare = host.lower()
    if ":" in bare:  # IPv6 literal
        bare = f"[{bare}]"
    return bare in allowlist or f"{bare}:{port}" in allowlist


async def address_problem(target: Target, allowlist: Collection[str]) -> str | None:
    """Why the target may not be contacted: a name that does not resolve, or an address that
    is loopback, link-local, private or otherwise not public; None when it may (or when the
    operator allows it). The lookup runs off the event loop."""
    if allowed_by(allowlist, target.host, target.port) or target.site:
        return None
    try:
        addresses = await asyncio.to_thread(resolve, target.host, target.port)
    except (socket.gaierror, UnicodeError):
        return f"host '{target.host}' does not resolve"
    for address in addresses:
        reason = forbidden_reason(address)
        if reason is not None:
            return (
                f"host '{target.host}' resolves to {address}, a {reason} address: telemetry is "
                "only sent to public addresses unless the operator lists the endpoint in "
                "NVCF_TELEMETRY_ALLOWLIST"
            )
    return None
