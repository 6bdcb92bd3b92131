"""`nvcf-server serve` over HTTPS: a self-signed certificate made once in the data directory
(and reused), or the operator's own `--tls-cert`/`--tls-key`; bad TLS options stop start-up
with one line naming the problem, before the port is bound.

The server runs as a real process; clients are httpx trusting exactly the certificate."""

from __future__ import annotations

import datetime
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import grpc
import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes

from service import cli
from service.core import tls
from tests.support.app import ADMIN_KEY
from tests.support.server import free_port, start_server, stop_server


def _trusting(cert: Path) -> ssl.SSLContext:
    """What a client told to trust only `cert` uses (strict, as Python 3.13's default is)."""
    context = ssl.create_default_context(cafile=str(cert))
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    return context


def _serve(tmp: Path, *args: str, ca: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = start_server(
        tmp,
        f"sqlite+aiosqlite:///{tmp / 'nvcf.db'}",
        port,
        args=args,
        ca=ca,
        NVCF_RECONCILER_ENABLED="false",
    )
    return proc, port


def _fingerprint(cert: Path) -> str:
    loaded = x509.load_pem_x509_certificate(cert.read_bytes())
    return loaded.fingerprint(hashes.SHA256()).hex(":").upper()


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int]]:
    data = tmp_path_factory.mktemp("tls")
    proc, port = _serve(data, "--tls-self-signed", ca=data / "tls" / tls.CERT_FILE)
    try:
        yield data, port
    finally:
        stop_server(proc)


def test_self_signed_https_is_trusted_by_a_client_given_the_certificate(
    self_signed: tuple[Path, int],
) -> None:
    data, port = self_signed
    cert = data / "tls" / tls.CERT_FILE
    with httpx.Client(base_url=f"https://127.0.0.1:{port}", verify=_trusting(cert)) as c:
        assert c.get("/health").json() == {"status": "ok"}
        r = c.get("/v2/nvcf/functions", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        assert r.status_code == 200 and r.json() == {"functions": []}
        # ngcsdk's first call, exactly as it sends it
        r = c.post(
            "/v3/keys/get-caller-info",
            content=urlencode({"credentials": ADMIN_KEY}),
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        assert r.status_code == 200 and r.json()["type"] == "SERVICE_KEY"
    # by name too: the certificate covers localhost
    with httpx.Client(verify=_trusting(cert)) as c:
        assert c.get(f"https://localhost:{port}/health").status_code == 200


def test_a_client_that_does_not_trust_the_certificate_is_refused(
    self_signed: tuple[Path, int],
) -> None:
    _, port = self_signed
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"https://127.0.0.1:{port}/health", verify=ssl.create_default_context())
    # and plain HTTP gets no HTTP answer from a TLS port
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)


def test_the_certificate_is_announced_and_its_key_is_private(
    self_signed: tuple[Path, int],
) -> None:
    data, port = self_signed
    cert, key = data / "tls" / tls.CERT_FILE, data / "tls" / tls.KEY_FILE
    assert key.stat().st_mode & 0o777 == 0o600
    log = (data / "server.log").read_text()
    assert f"generated self-signed TLS certificate {cert}" in log
    assert _fingerprint(cert) in log
    assert f"REQUESTS_CA_BUNDLE={cert}" in log and f"SSL_CERT_FILE={cert}" in log
    assert f"serving on https://127.0.0.1:{port}" in log
    assert "PRIVATE KEY" not in log
    names = (
        x509.load_pem_x509_certificate(cert.read_bytes())
        .extensions.get_extension_for_class(x509.SubjectAlternativeName)
        .value
    )
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    assert {str(a) for a in names.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1"}


def test_a_restart_reuses_the_certificate(tmp_path: Path) -> None:
    cert = tmp_path / "tls" / tls.CERT_FILE
    proc, _ = _serve(tmp_path, "--tls-self-signed", ca=cert)
    stop_server(proc)
    first = cert.read_bytes()
    proc, port = _serve(tmp_path, "--tls-self-signed", ca=cert)
    try:
        assert cert.read_bytes() == first
        assert (
            f"reusing self-signed TLS certificate {cert}" in (tmp_path / "server.log").read_text()
        )
        assert httpx.get(f"https://127.0.0.1:{port}/health", verify=_trusting(cert)).is_success
    finally:
        stop_server(proc)


def test_the_operators_certificate_and_key(tmp_path: Path) -> None:
    cert_pem, key_pem = tls.generate(["localhost", "127.0.0.1"])
    cert, key = tmp_path / "server.crt", tmp_path / "server.key"
    cert.write_bytes(cert_pem)
    key.write_bytes(key_pem)
    proc, port = _serve(tmp_path, "--tls-cert", str(cert), "--tls-key", str(key), ca=cert)
    try:
        r = httpx.get(f"https://127.0.0.1:{port}/health", verify=_trusting(cert))
        assert r.json() == {"status": "ok"}
        assert not (tmp_path / "tls").exists()  # nothing self-signed was made
    finally:
        stop_server(proc)


def test_bad_tls_options_stop_start_up_naming_the_problem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NVCF_DATA_DIR", str(tmp_path / "data"))
    cert_pem, key_pem = tls.generate(["localhost"])
    other_cert, _ = tls.generate(["localhost"])
    cert, key, other = tmp_path / "c.pem", tmp_path / "k.pem", tmp_path / "o.pem"
    cert.write_bytes(cert_pem)
    key.write_bytes(key_pem)
    other.write_bytes(other_cert)
    cases = [
        (("--tls-cert", str(cert)), "--tls-cert and --tls-key must be given together"),
        (("--tls-key", str(key)), "--tls-cert and --tls-key must be given together"),
        (
            ("--tls-cert", str(tmp_path / "none.pem"), "--tls-key", str(key)),
            f"TLS certificate file '{tmp_path / 'none.pem'}' does not exist",
        ),
        (("--tls-cert", str(other), "--tls-key", str(key)), "cannot be used together"),
        (("--tls-cert", str(key), "--tls-key", str(key)), "cannot be used together"),
        (
            ("--tls-self-signed", "--tls-cert", str(cert), "--tls-key", str(key)),
            "--tls-self-signed cannot be combined with --tls-cert/--tls-key",
        ),
    ]
    for args, message in cases:
        # cmd_serve is what `nvcf-server serve` runs; it returns before binding the port
        code = cli.cmd_serve(cli.build_parser().parse_args(["serve", *args]))
        out, err = capsys.readouterr()
        assert code == 2, (args, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("nvcf-server: "), (args, err)
        assert message in lines[0], (args, err)
        assert "serving on" not in out and "PRIVATE KEY" not in err
    assert not (tmp_path / "data" / "tls").exists()


def _grpc_status(channel: grpc.Channel, *, timeout: float) -> tuple[grpc.StatusCode, str]:
    """The status of a call without `function-id` (never OK)."""
    metadata = (("authorization", f"Bearer {ADMIN_KEY}"),)
    try:
        stub: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
            "/any.Service/Method"
        )
        stub(b"x", metadata=metadata, timeout=timeout)
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    raise AssertionError("the call succeeded")


def test_the_grpc_listener_serves_the_http_servers_certificate(tmp_path: Path) -> None:
    """`serve --tls-self-signed` with the gRPC listener on: it answers over TLS with the same
    certificate (its own refusal of a call without `function-id`), and refuses plaintext."""
    grpc_port = free_port()
    port = free_port()
    proc = start_server(
        tmp_path,
        f"sqlite+aiosqlite:///{tmp_path / 'nvcf.db'}",
        port,
        args=("--tls-self-signed",),
        ca=tmp_path / "tls" / tls.CERT_FILE,
        NVCF_RECONCILER_ENABLED="false",
        NVCF_GRPC_ENABLED="true",
        NVCF_GRPC_PORT=str(grpc_port),
    )
    try:
        cert = (tmp_path / "tls" / tls.CERT_FILE).read_bytes()
        trust = grpc.ssl_channel_credentials(root_certificates=cert)
        with grpc.secure_channel(f"localhost:{grpc_port}", trust) as channel:
            code, details = _grpc_status(channel, timeout=30)
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "function-id" in details
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as plain:
            code, _ = _grpc_status(plain, timeout=5)
        assert code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    finally:
        stop_server(proc)


def test_the_self_signed_certificate_covers_the_bound_address() -> None:
    assert tls.hosts_for("0.0.0.0") == ["localhost", "127.0.0.1", "::1"]
    assert tls.hosts_for("::") == ["localhost", "127.0.0.1", "::1"]
    assert tls.hosts_for("127.0.0.1") == ["localhost", "127.0.0.1", "::1"]
    assert tls.hosts_for("10.1.2.3") == ["localhost", "127.0.0.1", "::1", "10.1.2.3"]
    assert tls.hosts_for("nvcf.internal")[-1] == "nvcf.internal"


def test_it_is_replaced_only_when_it_no_longer_fits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = tls.ensure_self_signed(tmp_path, ["localhost", "127.0.0.1"])
    assert first.generated
    again = tls.ensure_self_signed(tmp_path, ["localhost"])  # a subset: still fits
    assert not again.generated and again.fingerprint == first.fingerprint
    wider = tls.ensure_self_signed(tmp_path, ["localhost", "127.0.0.1", "10.1.2.3"])
    assert wider.generated and wider.fingerprint != first.fingerprint
    # about to expire: replaced
    (tmp_path / "tls" / tls.CERT_FILE).unlink()
    monkeypatch.setattr(tls, "VALIDITY", datetime.timedelta(days=10))
    short = tls.ensure_self_signed(tmp_path, ["localhost"])
    monkeypatch.undo()
    assert short.generated
    renewed = tls.ensure_self_signed(tmp_path, ["localhost"])
    assert renewed.generated and renewed.fingerprint != short.fingerprint
    # an unreadable certificate is replaced too
    (tmp_path / "tls" / tls.CERT_FILE).write_text("not a certificate")
    assert tls.ensure_self_signed(tmp_path, ["localhost"]).generated
