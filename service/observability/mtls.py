"""Client certificates as a remote-write telemetry's key (NVCF's, as ngcsdk sends them for
PROMETHEUS and KRATOS_THANOS: `{"clientKey": <PEM key>, "clientCert": <PEM certificate>,
"caFile": <PEM CA certificates, optional>}`): checked at creation, stored encrypted as compact
JSON of those three fields, used for the TLS client authentication of the in-process exporter
(an `ssl.SSLContext`) and placed in the collector's Secret on Kubernetes. `caFile` is the CA
the endpoint's own certificate is checked against, besides the public ones (a self-signed
receiver)."""

from __future__ import annotations

import json
import os
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

CERT, KEY, CA = "clientCert", "clientKey", "caFile"
FIELDS = (CERT, KEY, CA)


@dataclass(frozen=True)
class ClientCertificate:
    """A client certificate chain (PEM), its private key (PEM) and the CAs to trust."""

    cert: str
    key: str = field(repr=False)
    ca: str | None = None

    def context(self) -> ssl.SSLContext:
        """A TLS client context presenting the certificate (and trusting `ca` besides the
        system's CAs). The ssl module loads a chain only from files: they are written to a
        private directory and removed once loaded."""
        context = ssl.create_default_context()
        if self.ca:
            context.load_verify_locations(cadata=self.ca)
        with tempfile.TemporaryDirectory(prefix="nvcf-mtls-") as directory:
            cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
            for path, text in ((cert, self.cert), (key, self.key)):
                descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(descriptor, "w") as out:
                    out.write(text)
            context.load_cert_chain(cert, key)
        return context


def _public(holder: Any) -> bytes:
    """The public key of a certificate or a private key, as DER."""
    return bytes(
        holder.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def problems(value: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field, message) of what is wrong with client certificates given as a key, none if
    nothing: both PEM texts given, the certificate's and the key's public keys the same, the
    key not encrypted, `caFile` PEM certificates; no other field."""
    out = [
        (k, f"is not a field of client certificates ({', '.join(FIELDS)})")
        for k in value
        if k not in FIELDS
    ]
    texts = {k: value.get(k) for k in FIELDS}
    pem = {k: v for k, v in texts.items() if isinstance(v, str) and v.strip()}
    for name in (CERT, KEY):
        if name not in pem:
            out.append((name, f"is required: the PEM text of the client's {name[6:].lower()}"))
    if texts[CA] is not None and not isinstance(texts[CA], str):
        out.append((CA, "must be the PEM text of the CA certificates"))
    cert = key = None
    if CERT in pem:
        try:
            cert = x509.load_pem_x509_certificates(pem[CERT].encode())[0]
        except ValueError:
            out.append((CERT, "is not a PEM certificate"))
    if KEY in pem:
        try:
            key = serialization.load_pem_private_key(pem[KEY].encode(), password=None)
        except (ValueError, TypeError):
            out.append((KEY, "is not an unencrypted PEM private key"))
    if cert is not None and key is not None and _public(cert) != _public(key):
        out.append((KEY, f"is not the private key of the certificate {CERT}"))
    if CA in pem:
        try:
            x509.load_pem_x509_certificates(pem[CA].encode())
        except ValueError:
            out.append((CA, "is not PEM certificates"))
    return out


def stored(value: Mapping[str, Any]) -> str:
    """The key as stored: compact JSON of the fields given."""
    return json.dumps({k: value[k] for k in FIELDS if value.get(k)}, separators=(",", ":"))


def of_key(key: str) -> ClientCertificate | None:
    """The client certificates a stored key holds; None for a key that is a token."""
    if not key.startswith("{"):
        return None
    try:
        value = json.loads(key)
    except ValueError:
        return None
    if not isinstance(value, dict) or not {CERT, KEY} <= value.keys():
        return None
    return ClientCertificate(str(value[CERT]), str(value[KEY]), value.get(CA) or None)
