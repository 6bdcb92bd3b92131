"""TLS for `nvcf-server serve`: a certificate the operator brings, or a self-signed one.

`ngcsdk` only speaks HTTPS (it rewrites `http://` in `NGC_CLI_API_URL` to `https://`), so a
local server needs a certificate. `ensure_self_signed` makes one for localhost (and the
address the server binds, when it is a specific one) in the data directory the first time and
reuses it on later starts, so a client told to trust it once keeps trusting it. It is replaced
only when it has expired, will within `RENEW_BEFORE`, or does not name a requested host.

The private key is written with mode 0600; the certificate is public (clients need to read it
to trust it).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CERT_FILE = "self-signed-cert.pem"
KEY_FILE = "self-signed-key.pem"
TLS_DIR = "tls"
#: the names every self-signed certificate covers
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
VALIDITY = datetime.timedelta(days=825)  # the longest lifetime clients accept for a leaf
RENEW_BEFORE = datetime.timedelta(days=30)
#: bind addresses that are not a name a client would connect to
_WILDCARDS = frozenset({"", "0.0.0.0", "::", "[::]"})  # noqa: S104 (names, not a bind)


class TlsError(Exception):
    """A certificate or key that cannot be used; the message names the file."""


@dataclass(frozen=True)
class SelfSigned:
    cert: Path
    key: Path
    generated: bool  # False: an existing certificate was reused
    fingerprint: str  # SHA-256, colon-separated hex, as browsers and `openssl x509` show it


def hosts_for(bind_host: str) -> list[str]:
    """The names a self-signed certificate should cover for a server bound to `bind_host`."""
    hosts = list(LOCAL_HOSTS)
    host = bind_host.strip("[]")
    if bind_host not in _WILDCARDS and host not in hosts:
        hosts.append(host)
    return hosts


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _fingerprint(cert: x509.Certificate) -> str:
    return cert.fingerprint(hashes.SHA256()).hex(":").upper()


def _covers(cert: x509.Certificate, hosts: Iterable[str]) -> bool:
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    present = set(names)
    return all(_san(h) in present for h in hosts)


def _usable(cert_path: Path, key_path: Path, hosts: list[str]) -> x509.Certificate | None:
    """The existing certificate when it can be reused as is, else None."""
    if not (cert_path.is_file() and key_path.is_file()):
        return None
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except ValueError:
        return None
    now = datetime.datetime.now(datetime.UTC)
    if cert.not_valid_after_utc - RENEW_BEFORE <= now or not _covers(cert, hosts):
        return None
    return cert


def _write(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as fh:
        os.fchmod(fh.fileno(), mode)  # whatever the umask
        fh.write(data)
    os.replace(tmp, path)


def generate(hosts: list[str]) -> tuple[bytes, bytes]:
    """A new self-signed certificate for `hosts` and its key (PEM): an ECDSA P-256 server
    certificate that is its own issuer, as strict verifiers (Python 3.13's default
    `VERIFY_X509_STRICT`) accept for a trust anchor."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "nvcf-server"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"nvcf-server self-signed ({hosts[0]})"),
        ]
    )
    now = datetime.datetime.now(datetime.UTC)
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def ensure_self_signed(data_dir: Path, hosts: list[str]) -> SelfSigned:
    """The self-signed certificate of this data directory: reused, or made now."""
    directory = data_dir / TLS_DIR
    cert_path, key_path = directory / CERT_FILE, directory / KEY_FILE
    existing = _usable(cert_path, key_path, hosts)
    if existing is not None:
        return SelfSigned(cert_path, key_path, False, _fingerprint(existing))
    cert_pem, key_pem = generate(hosts)
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        _write(key_path, key_pem, 0o600)
        _write(cert_path, cert_pem, 0o644)
    except OSError as exc:
        raise TlsError(
            f"cannot write the self-signed certificate into '{directory}': {exc.strerror}"
        ) from None
    cert = x509.load_pem_x509_certificate(cert_pem)
    return SelfSigned(cert_path, key_path, True, _fingerprint(cert))


def check_pair(cert: Path, key: Path) -> None:
    """Fail with a message naming the file unless `cert` and `key` make a usable server pair."""
    for path, what in ((cert, "certificate"), (key, "key")):
        if not path.is_file():
            raise TlsError(f"TLS {what} file '{path}' does not exist")
        if not os.access(path, os.R_OK):
            raise TlsError(f"TLS {what} file '{path}' is not readable")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)

    def no_passphrase() -> bytes:
        raise TlsError(f"TLS key '{key}' is encrypted; give the server an unencrypted key")

    try:
        context.load_cert_chain(cert, key, password=no_passphrase)
    except ssl.SSLError as exc:
        raise TlsError(
            f"TLS certificate '{cert}' and key '{key}' cannot be used together: {exc.reason}"
        ) from None
    except OSError as exc:  # e.g. a passphrase-protected key with no terminal
        raise TlsError(f"TLS certificate '{cert}' or key '{key}': {exc}") from None


__all__ = [
    "LOCAL_HOSTS",
    "SelfSigned",
    "TlsError",
    "check_pair",
    "ensure_self_signed",
    "generate",
    "hosts_for",
]
