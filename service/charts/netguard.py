"""The network side of the SSRF guard (helm.md §1.1): resolve a host once, check every address
it resolves to, and connect to exactly those checked addresses.

Checking a name and then letting the HTTP client resolve it again is open to DNS rebinding: a
name that answers a public address to the check and 127.0.0.1 to the client reaches loopback.
Here `resolve` is the only name lookup of a chart pull; its answers are checked and pinned,
and `PinnedAdapter` (requests/urllib3, as used by oras-py) opens its sockets to the pinned
addresses while keeping the host name for the Host header, TLS SNI and certificate checks.

`HostPolicy` is one chart pull's policy: which hosts and schemes it may contact (the
registry allowlist, the insecure registries), each checked once and pinned; `guard` mounts it
on a requests session (every request, token realm and redirect hop passes it).
"""

from __future__ import annotations

import ipaddress
import socket
import sys
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from socket import timeout as SocketTimeout
from typing import Any, Protocol
from urllib.parse import urljoin, urlsplit

import requests
import requests.adapters
from urllib3 import PoolManager
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool
from urllib3.exceptions import ConnectTimeoutError, NewConnectionError
from urllib3.util import connection

from service.core.errors import BadGateway

_CGNAT = ipaddress.IPv4Network("100.64.0.0/10")
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")  # deprecated ::a.b.c.d (RFC 4291 §2.5.5.1)
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # well-known NAT64 prefix (RFC 6052)
_SIX_TO_FOUR = "6to4 2002::/16"


def resolve(hostname: str, port: int) -> list[str]:
    """Every address `hostname` resolves to, in resolver order without repeats.

    The one name lookup of the chart fetcher (tests substitute it); raises socket.gaierror.
    """
    infos = socket.getaddrinfo(hostname, port, type=socket.SOCK_STREAM)
    addresses: list[str] = []
    for info in infos:
        address = str(info[4][0])
        if address not in addresses:
            addresses.append(address)
    return addresses


def _ipv4_reason(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if isinstance(ip, ipaddress.IPv4Address) and ip in _CGNAT:
        return "carrier-grade NAT (100.64.0.0/10)"
    if ip.is_multicast:
        return "multicast"
    if ip.is_private:
        return "private"
    if ip.is_reserved:
        return "reserved"
    if not ip.is_global:
        return "non-public"
    return None


def _embedded(ip: ipaddress.IPv6Address) -> tuple[str, list[ipaddress.IPv4Address]] | None:
    """The IPv4 addresses an IPv6 address carries and the kind of embedding, if any."""
    if ip.sixtofour is not None:
        return _SIX_TO_FOUR, [ip.sixtofour]
    if ip.teredo is not None:
        server, client = ip.teredo
        return "Teredo 2001::/32", [server, client]
    if ip in _NAT64:
        return "NAT64 64:ff9b::/96", [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)]
    if ip in _IPV4_COMPATIBLE and int(ip) > 1:
        return "IPv4-compatible ::/96", [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)]
    return None


def forbidden_reason(address: str) -> str | None:
    """Why an address must not be contacted, or None when it is a public address.

    IPv6 addresses that embed an IPv4 address (IPv4-mapped, IPv4-compatible, NAT64, 6to4,
    Teredo) are judged by the embedded address under the same rules, as that is where their
    traffic ends up; an IPv4-mapped address is judged as its IPv4 address alone.
    """
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return _ipv4_reason(ip.ipv4_mapped)
        embedded = _embedded(ip)
        if embedded is not None:
            kind, inner = embedded
            for v4 in inner:
                reason = _ipv4_reason(v4)
                if reason is not None:
                    return f"{reason} ({kind} embedding {v4})"
            if kind in (_SIX_TO_FOUR, "NAT64 64:ff9b::/96"):
                return None  # relayed to the public IPv4 address it embeds
    return _ipv4_reason(ip)


def host_key(hostname: str, port: int) -> tuple[str, int]:
    """How a pinned host is looked up: lower case, no IPv6 brackets, no trailing dot."""
    return hostname.strip("[]").lower().rstrip("."), port


class AddressBook(Protocol):
    """Hands out the checked addresses of a host; raises (a refusal) for unchecked hosts."""

    def pinned(self, hostname: str, port: int) -> Sequence[str]: ...


def _connect(conn: HTTPConnection, book: AddressBook) -> socket.socket:
    """urllib3's `_new_conn`, but to the pinned addresses of `conn.host` instead of a fresh
    lookup; failures are worded exactly as urllib3 words them."""
    addresses = book.pinned(conn.host, conn.port)
    last: OSError | None = None
    for address in addresses:
        try:
            sock = connection.create_connection(
                (address, conn.port),
                conn.timeout,
                source_address=conn.source_address,
                socket_options=conn.socket_options,
            )
        except OSError as exc:
            last = exc
            continue
        sys.audit("http.client.connect", conn, conn.host, conn.port)
        return sock
    if isinstance(last, SocketTimeout):
        raise ConnectTimeoutError(
            conn, f"Connection to {conn.host} timed out. (connect timeout={conn.timeout})"
        ) from last
    raise NewConnectionError(conn, f"Failed to establish a new connection: {last}") from last


class PinnedHTTPConnection(HTTPConnection):
    def __init__(self, *args: Any, book: AddressBook, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._book = book

    def _new_conn(self) -> socket.socket:
        return _connect(self, self._book)

    def __str__(self) -> str:  # named as urllib3 names it in errors, which callers quote
        return f"HTTPConnection(host={self.host!r}, port={self.port!r})"


class PinnedHTTPSConnection(HTTPSConnection):
    """Connects to a pinned address; SNI and the certificate check use the host name."""

    def __init__(self, *args: Any, book: AddressBook, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._book = book

    def _new_conn(self) -> socket.socket:
        return _connect(self, self._book)

    def __str__(self) -> str:
        return f"HTTPSConnection(host={self.host!r}, port={self.port!r})"


class _PinnedPoolManager(PoolManager):
    def __init__(self, book: AddressBook, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._book = book

    def _new_pool(
        self,
        scheme: str,
        host: str,
        port: int,
        request_context: dict[str, Any] | None = None,
    ) -> HTTPConnectionPool:
        pool = super()._new_pool(scheme, host, port, request_context)
        pool.ConnectionCls = PinnedHTTPSConnection if scheme == "https" else PinnedHTTPConnection
        pool.conn_kw["book"] = self._book
        return pool


class PinnedAdapter(requests.adapters.HTTPAdapter):
    """A requests adapter whose connections go only to addresses `book` pinned.

    Proxies are not used: a proxy would resolve the host again, out of reach of the check.
    """

    def __init__(self, book: AddressBook, **kwargs: Any) -> None:
        self._book = book  # before super().__init__, which builds the pool manager
        super().__init__(**kwargs)

    def init_poolmanager(
        self,
        connections: int,
        maxsize: int,
        block: bool = requests.adapters.DEFAULT_POOLBLOCK,
        **pool_kwargs: Any,
    ) -> None:
        self._pool_connections = connections
        self._pool_maxsize = maxsize
        self._pool_block = block
        self.poolmanager = _PinnedPoolManager(
            self._book, num_pools=connections, maxsize=maxsize, block=block, **pool_kwargs
        )

    def send(  # type: ignore[override]
        self, request: requests.PreparedRequest, **kwargs: Any
    ) -> requests.Response:
        kwargs["proxies"] = {}
        return super().send(request, **kwargs)


__all__ = ["AddressBook", "PinnedAdapter", "forbidden_reason", "host_key", "resolve"]


# --- the host policy of one chart pull -------------------------------------------------------


class GuardedAdapter(PinnedAdapter):
    """Applies the timeout and the SSRF/plain-HTTP policy to every request, including token
    realms on other hosts and each redirect hop, and connects only to the addresses the policy
    checked and pinned."""

    def __init__(self, policy: HostPolicy, timeout: float) -> None:
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


def default_port(scheme: str) -> int:
    return 80 if scheme == "http" else 443


@dataclass
class HostPolicy:
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

    def pin(self, host: str, hostname: str, port: int | None, addresses: Sequence[str]) -> None:
        """Pin the chart host's addresses that `check_host` resolved and checked (`host` as
        the chart URL names it, with its port if any)."""
        if addresses:
            port = port or default_port(self.scheme_for(host))
            self._pins[host_key(hostname, port)] = list(addresses)

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
        port = parts.port or default_port(parts.scheme)
        key = host_key(hostname, port)
        if key in self._pins:
            return
        try:
            addresses = resolve(hostname, port)
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


def guard(session: requests.Session, policy: HostPolicy, timeout: float) -> None:
    adapter = GuardedAdapter(policy, timeout)
    session.mount("https://", adapter)
    session.mount("http://", adapter)
    session.hooks["response"].append(policy.redirect_hook)
