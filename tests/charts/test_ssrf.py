"""The SSRF guard against DNS rebinding and embedded IPv4 addresses (helm.md §1.1).

A host is resolved once per pull (`service.charts.netguard.resolve`), every address is checked,
and connections go to exactly the checked addresses. The rebinding resolvers here answer a
public address first and 127.0.0.1 after; a real HTTP server on 127.0.0.1 records every
connection it accepts, so "never contacted" is observed, not inferred. Connections to the
(fake) public address are refused by a stand-in for the outside network.
"""

from __future__ import annotations

import datetime
import errno
import http.server
import ipaddress
import socket
import ssl
import threading
from collections.abc import Callable, Iterator, Sequence
from itertools import count
from pathlib import Path
from typing import Any

import helm_python
import pytest
import urllib3.util.connection
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from service.charts import netguard
from service.charts.fetch import ChartFetcher
from service.charts.netguard import forbidden_reason
from service.charts.url import check_host, parse_chart_url
from service.core.errors import BadGateway, BadRequest, DomainError
from tests.support.registry import write_chart

MiB = 1024 * 1024
PUBLIC = "8.8.8.8"
_names = count()


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Answers 404, or `reply` of the server; the server records connections and requests."""

    server: _Server

    def do_GET(self) -> None:
        self.server.requests.append((self.path, self.headers.get("Host", "")))
        status, headers, body = self.server.reply(self.path)
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def _not_found(path: str) -> tuple[int, dict[str, str], bytes]:
    return 404, {}, b""


class _Server(http.server.ThreadingHTTPServer):
    def __init__(self, reply: Callable[[str], tuple[int, dict[str, str], bytes]]) -> None:
        super().__init__(("127.0.0.1", 0), _Recorder)
        self.reply = reply
        self.contacts: list[tuple[str, int]] = []  # every accepted TCP connection
        self.requests: list[tuple[str, str]] = []  # (path, Host header)

    def process_request(self, request: Any, client_address: Any) -> None:
        self.contacts.append(client_address)
        super().process_request(request, client_address)

    @property
    def port(self) -> int:
        return int(self.server_address[1])


@pytest.fixture
def serve() -> Iterator[Callable[..., _Server]]:
    """`serve(reply=...)` starts a recording HTTP server on 127.0.0.1; all stopped after."""
    started: list[tuple[_Server, threading.Thread]] = []

    def start(
        reply: Callable[[str], tuple[int, dict[str, str], bytes]] = _not_found,
        tls: ssl.SSLContext | None = None,
    ) -> _Server:
        server = _Server(reply)
        if tls is not None:
            server.socket = tls.wrap_socket(server.socket, server_side=True)
        thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        thread.start()
        started.append((server, thread))
        return server

    yield start
    for server, thread in started:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def network(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records every host urllib3 opens a socket to; loopback is reached for real, anything
    else is refused (there is no outside network in tests)."""
    real = urllib3.util.connection.create_connection
    opened: list[str] = []

    def create_connection(address: tuple[str, int], *args: Any, **kwargs: Any) -> socket.socket:
        host = address[0]
        opened.append(host)
        try:
            public = not ipaddress.ip_address(host).is_loopback
        except ValueError:
            public = False  # a host name: resolved by the real function
        if public:
            raise ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
        return real(address, *args, **kwargs)

    monkeypatch.setattr(urllib3.util.connection, "create_connection", create_connection)
    return opened


Lookups = dict[str, int]


def answer(monkeypatch: pytest.MonkeyPatch, answers: dict[str, Sequence[Sequence[str]]]) -> Lookups:
    """Substitute netguard.resolve: host name -> successive answers (the last one repeats);
    returns the number of lookups per name."""
    real = netguard.resolve
    lookups: Lookups = {}

    def resolve(hostname: str, port: int) -> list[str]:
        if hostname not in answers:
            return real(hostname, port)
        n = lookups.get(hostname, 0)
        lookups[hostname] = n + 1
        replies = answers[hostname]
        return list(replies[min(n, len(replies) - 1)])

    monkeypatch.setattr(netguard, "resolve", resolve)
    return lookups


def rebinding(host: str) -> dict[str, Sequence[Sequence[str]]]:
    return {host: [[PUBLIC], ["127.0.0.1"]]}


def system_answers(monkeypatch: pytest.MonkeyPatch, name: str, answers: Sequence[str]) -> None:
    """Make the system resolver itself answer `name` with successive `answers` (the last one
    repeats), below any resolver function of the service."""
    real = socket.getaddrinfo
    calls = count()

    def getaddrinfo(hostname: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if hostname == name:
            hostname = answers[min(next(calls), len(answers) - 1)]
        return real(hostname, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def fetcher(tmp_path: Path, *, allowlist: set[str], insecure: set[str]) -> ChartFetcher:
    return ChartFetcher(
        tmp_path / f"cache-{next(_names)}",
        allowlist=allowlist,
        insecure=insecure,
        max_bytes=10 * MiB,
        max_unpacked_bytes=50 * MiB,
        timeout=5,
    )


def chart_url(kind: str, host: str) -> str:
    if kind == "oci":
        return f"oci://{host}/acme/charts/demo:1.0.0"
    return f"https://{host}/charts/demo-1.0.0.tgz"


async def failure(tmp_path: Path, url: str, **hosts: set[str]) -> DomainError:
    with pytest.raises(DomainError) as info:
        await fetcher(tmp_path, **hosts).fetch(parse_chart_url(url), [])
    return info.value


# --- addresses embedding IPv4 -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("2002:7f00:1::1", "loopback (6to4 2002::/16 embedding 127.0.0.1)"),
        ("2002:a00:5::1", "private (6to4 2002::/16 embedding 10.0.0.5)"),
        ("2002:a9fe:a9fe::", "link-local (6to4 2002::/16 embedding 169.254.169.254)"),
        ("64:ff9b::7f00:1", "loopback (NAT64 64:ff9b::/96 embedding 127.0.0.1)"),
        ("64:ff9b::a00:5", "private (NAT64 64:ff9b::/96 embedding 10.0.0.5)"),
        ("::ffff:10.0.0.5", "private"),
        ("::ffff:127.0.0.1", "loopback"),
        ("::7f00:1", "loopback (IPv4-compatible ::/96 embedding 127.0.0.1)"),
        # Teredo: server 65.54.227.120, client (inverted in the last 32 bits) 127.0.0.1
        (
            "2001:0:4136:e378:8000:63bf:80ff:fffe",
            "loopback (Teredo 2001::/32 embedding 127.0.0.1)",
        ),
        # Teredo with a private server address
        ("2001:0:a00:5::1", "private (Teredo 2001::/32 embedding 10.0.0.5)"),
    ],
)
def test_embedded_private_ipv4_is_forbidden(address: str, reason: str) -> None:
    assert forbidden_reason(address) == reason


@pytest.mark.parametrize("address", ["2002:808:808::1", "64:ff9b::808:808", "::ffff:8.8.8.8"])
def test_embedded_public_ipv4_is_allowed(address: str) -> None:
    """6to4 and NAT64 traffic ends at the public IPv4 address they carry."""
    assert forbidden_reason(address) is None


def test_teredo_is_refused_even_with_public_addresses() -> None:
    assert forbidden_reason("2001:0:808:808::1") is not None


@pytest.mark.parametrize("address", ["2002:7f00:1::1", "64:ff9b::a00:5", "::ffff:127.0.0.1"])
async def test_chart_host_resolving_to_embedded_private_ipv4_is_refused(
    monkeypatch: pytest.MonkeyPatch, address: str
) -> None:
    answer(monkeypatch, {"reg.example.com": [[PUBLIC, address]]})
    ref = parse_chart_url("oci://reg.example.com/a/c:1.0")
    with pytest.raises(BadRequest, match="NVCF_REGISTRY_ALLOWLIST"):
        await check_host(ref, allowlist=set())


async def test_token_realm_resolving_to_6to4_loopback_is_refused(
    monkeypatch: pytest.MonkeyPatch,
    serve: Callable[..., _Server],
    network: list[str],
    tmp_path: Path,
) -> None:
    realm = "realm.example.com"
    registry = serve(_challenging(f"http://{realm}/token"))
    answer(monkeypatch, {realm: [["2002:7f00:1::1"]]})
    host = f"127.0.0.1:{registry.port}"
    error = await failure(
        tmp_path, chart_url("oci", host), allowlist={host}, insecure={host, realm}
    )
    assert error.detail == (
        f"Refused to contact {realm} (named by registry {host}) while pulling chart "
        f"{chart_url('oci', host)}: it resolves to a non-public address; allow it with "
        "NVCF_REGISTRY_ALLOWLIST."
    )
    assert set(network) == {"127.0.0.1"}  # only the registry itself


# --- DNS rebinding ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["oci", "https"])
async def test_rebinding_chart_host_never_reaches_loopback(
    monkeypatch: pytest.MonkeyPatch,
    serve: Callable[..., _Server],
    network: list[str],
    tmp_path: Path,
    kind: str,
) -> None:
    victim = serve()
    host = f"rebind.example.com:{victim.port}"
    lookups = answer(monkeypatch, rebinding("rebind.example.com"))

    error = await failure(tmp_path, chart_url(kind, host), allowlist=set(), insecure={host})

    assert victim.contacts == []
    assert lookups == {"rebind.example.com": 1}  # resolved once, by the check
    assert network == [PUBLIC]  # connected to exactly the checked address
    assert isinstance(error, BadGateway)
    assert "Connection refused" in error.detail


async def test_rebinding_system_resolver_never_reaches_loopback(
    monkeypatch: pytest.MonkeyPatch,
    serve: Callable[..., _Server],
    network: list[str],
    tmp_path: Path,
) -> None:
    """The same attack one level down: the system resolver itself answers differently."""
    victim = serve()
    host = f"rebind.example.com:{victim.port}"
    system_answers(monkeypatch, "rebind.example.com", [PUBLIC, "127.0.0.1"])
    error = await failure(tmp_path, chart_url("oci", host), allowlist=set(), insecure={host})
    assert victim.contacts == []
    assert isinstance(error, BadGateway)


def _challenging(realm: str) -> Callable[[str], tuple[int, dict[str, str], bytes]]:
    """A registry that wants a bearer token from `realm` for everything."""

    def reply(path: str) -> tuple[int, dict[str, str], bytes]:
        challenge = f'Bearer realm="{realm}",service="registry",scope="repository:a:pull"'
        return 401, {"WWW-Authenticate": challenge}, b""

    return reply


async def test_rebinding_token_realm_never_reaches_loopback(
    monkeypatch: pytest.MonkeyPatch,
    serve: Callable[..., _Server],
    network: list[str],
    tmp_path: Path,
) -> None:
    victim = serve()
    realm = f"realm.example.com:{victim.port}"
    registry = serve(_challenging(f"http://{realm}/token"))
    host = f"127.0.0.1:{registry.port}"
    lookups = answer(monkeypatch, rebinding("realm.example.com"))

    error = await failure(
        tmp_path, chart_url("oci", host), allowlist={host}, insecure={host, realm}
    )

    assert registry.requests  # the registry was asked and named its realm
    assert victim.contacts == []
    assert lookups == {"realm.example.com": 1}
    assert PUBLIC in network
    assert error.detail.startswith(f"Could not reach the token server {realm} of registry")


# --- no port-scan oracle ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "case", ["loopback-chart-host", "rebinding-chart-host", "loopback-realm", "rebinding-realm"]
)
async def test_refusal_reads_the_same_for_an_open_and_a_closed_port(
    monkeypatch: pytest.MonkeyPatch,
    serve: Callable[..., _Server],
    network: list[str],
    closed_port: int,
    tmp_path: Path,
    case: str,
) -> None:
    """Whatever listens on the refused address, the caller learns nothing about it."""
    victim = serve()
    name = "inside.example.com"

    async def detail(port: int) -> str:
        rebinds = case.startswith("rebinding")
        system_answers(monkeypatch, name, [PUBLIC, "127.0.0.1"] if rebinds else ["127.0.0.1"])
        target = f"{name}:{port}"
        if case.endswith("realm"):
            registry = serve(_challenging(f"http://{target}/token"))
            host = f"127.0.0.1:{registry.port}"
            url = chart_url("oci", host)
            error = await failure(tmp_path, url, allowlist={host}, insecure={host, target})
            return error.detail.replace(str(port), "PORT").replace(host, "REGISTRY")
        url = chart_url("oci", target)
        error = await failure(tmp_path, url, allowlist=set(), insecure={target})
        return error.detail.replace(str(port), "PORT")

    open_text = await detail(victim.port)
    closed_text = await detail(closed_port)
    assert open_text == closed_text
    assert victim.contacts == []
    assert all(ipaddress.ip_address(host) for host in network)  # never a name to resolve


async def test_closed_port_of_an_allowed_host_is_worded_as_before(
    closed_port: int, tmp_path: Path
) -> None:
    host = f"127.0.0.1:{closed_port}"
    url = chart_url("oci", host)
    error = await failure(tmp_path, url, allowlist={host}, insecure={host})
    assert error.detail == (
        f"Could not reach registry {host} to pull chart {url}: HTTPConnection(host='127.0.0.1', "
        f"port={closed_port}): Failed to establish a new connection: [Errno 111] Connection "
        "refused."
    )


# --- allow-listed names: pinned too, Host header and TLS name kept ------------------------------


@pytest.fixture
def archive(tmp_path: Path) -> bytes:
    src = write_chart(tmp_path / "src", "demo", "1.0.0")
    return Path(helm_python.package(src, destination=tmp_path)).read_bytes()


def _serving(archive: bytes) -> Callable[[str], tuple[int, dict[str, str], bytes]]:
    def reply(path: str) -> tuple[int, dict[str, str], bytes]:
        return (200, {}, archive) if path.endswith("/demo-1.0.0.tgz") else (404, {}, b"")

    return reply


async def test_allowlisted_name_is_resolved_once_and_keeps_its_host_header(
    monkeypatch: pytest.MonkeyPatch,
    serve: Callable[..., _Server],
    network: list[str],
    archive: bytes,
    tmp_path: Path,
) -> None:
    server = serve(_serving(archive))
    host = f"charts.internal:{server.port}"
    lookups = answer(monkeypatch, {"charts.internal": [["127.0.0.1"]]})
    chart_fetcher = fetcher(tmp_path, allowlist={host}, insecure={host})
    fetched = await chart_fetcher.fetch(parse_chart_url(chart_url("https", host)), [])
    assert fetched.size == len(archive)
    assert lookups == {"charts.internal": 1}
    assert network == ["127.0.0.1"]
    assert server.requests == [("/charts/demo-1.0.0.tgz", host)]


def _self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


async def test_tls_to_a_pinned_address_uses_the_host_name_for_sni_and_the_certificate(
    monkeypatch: pytest.MonkeyPatch,
    serve: Callable[..., _Server],
    network: list[str],
    archive: bytes,
    tmp_path: Path,
) -> None:
    cert, key = _self_signed(tmp_path, "charts.internal")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    names: list[str | None] = []
    context.sni_callback = lambda sock, name, ctx: names.append(name)
    server = serve(_serving(archive), tls=context)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(cert))
    host = f"charts.internal:{server.port}"
    answer(monkeypatch, {"charts.internal": [["127.0.0.1"]]})

    chart_fetcher = fetcher(tmp_path, allowlist={host}, insecure=set())
    fetched = await chart_fetcher.fetch(parse_chart_url(chart_url("https", host)), [])

    assert fetched.size == len(archive)
    assert network == ["127.0.0.1"]
    assert names == ["charts.internal"]
    assert server.requests == [("/charts/demo-1.0.0.tgz", host)]
