"""Real OCI registries and helpers to push Helm charts to them: `registry:2` containers where a
Docker engine answers (containers.py, chosen by services.py), else Debian's `docker-registry`
on this machine.

Used by the pytest fixtures in tests/conftest.py and tests/charts/conftest.py; plain functions
so other suites and scripts can start registries too.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import http.server
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, cast

import yaml

from tests.support import services

REGISTRY_BINARY = "docker-registry"
_START_TIMEOUT = 30.0


class RegistryUnavailable(RuntimeError):
    """The registry binary is missing and could not be installed, or it would not start."""


def ensure_binaries() -> str:
    """Path of the registry binary, installing `docker-registry` and `apache2-utils` if needed."""
    if shutil.which(REGISTRY_BINARY) is None or shutil.which("htpasswd") is None:
        if shutil.which("apt-get") is None or os.geteuid() != 0:
            raise RegistryUnavailable(
                "docker-registry is not installed and apt-get cannot be run as root here; "
                "install it with: apt-get install -y docker-registry apache2-utils"
            )
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "-q", "docker-registry", "apache2-utils"]
        if subprocess.run(install, env=env, capture_output=True, check=False).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, check=False)
            done = subprocess.run(install, env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RegistryUnavailable(
                    f"apt-get install docker-registry apache2-utils failed: {done.stderr[-500:]}"
                )
    path = shutil.which(REGISTRY_BINARY)
    if path is None:
        raise RegistryUnavailable("docker-registry is still not on PATH after installing it")
    return path


def htpasswd_line(username: str, password: str) -> str:
    """A bcrypt htpasswd entry; the password goes through stdin, never the command line."""
    done = subprocess.run(
        ["htpasswd", "-niB", username],
        input=password + "\n",
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Runner(Protocol):
    """What runs a registry: a local process or a container."""

    def log_text(self) -> str: ...

    def running(self) -> bool: ...

    def stop(self) -> None: ...


@dataclass
class LocalProcess:
    """A local `docker-registry serve` process and its log file."""

    process: subprocess.Popen[bytes]
    log_path: Path

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def running(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class RegistryServer:
    """A running registry; `host` is "HOST:PORT" (127.0.0.1 locally); `kind` is "local" or
    "containers"."""

    host: str
    root: Path
    runner: Runner
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    token_server: TokenServer | None = None  # set for token-auth registries; not owned
    kind: services.Kind = "local"

    @property
    def auth(self) -> bool:
        return self.username is not None

    def log_text(self) -> str:
        return self.runner.log_text()

    def blob_gets(self, digest: str) -> int:
        """How many successful GETs of blob `digest` the registry's access log shows."""
        pattern = re.compile(rf'"GET /v2/[^ ]+/blobs/{re.escape(digest)} HTTP/[0-9.]+" 200 ')
        return len(pattern.findall(self.log_text()))

    def running(self) -> bool:
        return self.runner.running()

    def stop(self) -> None:
        self.runner.stop()


def _config(
    root: Path,
    port: int,
    htpasswd_path: Path | None,
    token_auth: Mapping[str, str] | None = None,
) -> dict[str, object]:
    config: dict[str, object] = {
        "version": 0.1,
        "log": {"level": "warn", "accesslog": {"disabled": False}},
        "storage": {
            "filesystem": {"rootdirectory": str(root / "data")},
            "delete": {"enabled": True},
            "maintenance": {"uploadpurging": {"enabled": False}},
        },
        "http": {"addr": f"127.0.0.1:{port}", "secret": secrets.token_hex(16)},
    }
    if htpasswd_path is not None:
        config["auth"] = {"htpasswd": {"realm": "nvcf-test", "path": str(htpasswd_path)}}
    if token_auth is not None:
        config["auth"] = {"token": dict(token_auth)}
    return config


def start_registry(
    tmpdir: Path,
    *,
    htpasswd: tuple[str, str] | None = None,
    attempts: int = 3,
    token: TokenServer | None = None,
    login: tuple[str, str] | None = None,
) -> RegistryServer:
    """Start a registry of the kind the run uses (services.py) with its own config under
    `tmpdir`; `htpasswd` = (username, password).

    With `token` (a started TokenServer) the registry uses Docker token auth against it instead;
    `login` = (username, password) is then the account the push helpers log in with.
    """
    if htpasswd is not None and token is not None:
        raise ValueError("a registry uses either htpasswd or token auth, not both")
    if services.selected().kind == "containers":
        from tests.support.containers import start_registry_container

        return start_registry_container(tmpdir, htpasswd=htpasswd, token=token, login=login)
    binary = ensure_binaries()
    tmpdir.mkdir(parents=True, exist_ok=True)
    login = login or htpasswd
    token_auth = token.registry_auth() if token is not None else None
    htpasswd_path: Path | None = None
    if htpasswd is not None:
        htpasswd_path = tmpdir / "htpasswd"
        htpasswd_path.write_text(htpasswd_line(*htpasswd) + "\n")
    last_error = ""
    for attempt in range(attempts):
        port = _free_port()
        config_path = tmpdir / "config.yml"
        config_path.write_text(yaml.safe_dump(_config(tmpdir, port, htpasswd_path, token_auth)))
        log_path = tmpdir / f"registry-{attempt}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [binary, "serve", str(config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=tmpdir,
            )
        server = RegistryServer(
            host=f"127.0.0.1:{port}",
            root=tmpdir,
            runner=LocalProcess(process, log_path),
            username=login[0] if login else None,
            password=login[1] if login else None,
            token_server=token,
        )
        if wait_ready(server):
            return server
        server.stop()
        last_error = server.log_text()[-2000:]
    raise RegistryUnavailable(f"docker-registry did not start: {last_error}")


def wait_ready(server: RegistryServer) -> bool:
    """Whether the registry answers `/v2/` (200, or 401 with auth) within the start timeout."""
    deadline = time.monotonic() + _START_TIMEOUT
    while time.monotonic() < deadline:
        if not server.running():
            return False
        try:
            with urllib.request.urlopen(f"http://{server.host}/v2/", timeout=2) as response:
                if response.status == 200:
                    return True
        except urllib.error.HTTPError as exc:
            if exc.code == 401:
                return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


def write_chart(
    directory: Path, name: str, version: str, *, description: str = "test chart"
) -> Path:
    """Write a minimal valid chart source directory; returns its path."""
    chart = directory / name
    (chart / "templates").mkdir(parents=True, exist_ok=True)
    (chart / "Chart.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v2",
                "name": name,
                "version": version,
                "description": description,
                "type": "application",
            }
        )
    )
    (chart / "values.yaml").write_text("port: 8000\n")
    (chart / "templates" / "service.yaml").write_text(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {{ .Release.Name }}-svc\n"
        "spec:\n  ports:\n    - port: {{ .Values.port }}\n"
    )
    return chart


def push_chart(
    server: RegistryServer,
    chart_dir: Path,
    namespace: str,
    *,
    workdir: Path,
) -> str:
    """Package `chart_dir` and push it to oci://host/namespace with Helm, as users do.

    Returns the manifest digest the registry stored.
    """
    import helm_python

    workdir.mkdir(parents=True, exist_ok=True)
    archive = helm_python.package(chart_dir, destination=workdir)
    client = helm_python.RegistryClient(
        plain_http=True, credentials_file=workdir / "registry-credentials.json"
    )
    if server.username is not None and server.password is not None:
        client.login(server.host, server.username, server.password, plain_http=True)
    client.push(archive, f"oci://{server.host}/{namespace}")
    meta = yaml.safe_load((chart_dir / "Chart.yaml").read_text())
    resolved = client.resolve(f"oci://{server.host}/{namespace}/{meta['name']}:{meta['version']}")
    digest = resolved.get("digest")
    if not isinstance(digest, str):
        raise RuntimeError(f"helm could not resolve the chart it pushed: {resolved}")
    return digest


# --- Docker registry token auth (distribution's `auth: token`) --------------------------------


@dataclass(frozen=True)
class TokenUser:
    """An account of the token server and the repository actions it is granted."""

    password: str = field(repr=False)
    actions: frozenset[str] = frozenset({"pull"})


@dataclass(frozen=True)
class TokenRequest:
    """One request the token server answered (for assertions)."""

    username: str | None  # None: anonymous
    status: int
    scopes: tuple[str, ...]
    access: tuple[tuple[str, tuple[str, ...]], ...]  # (repository, granted actions)


class _TokenHTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    owner: TokenServer


class _TokenHandler(http.server.BaseHTTPRequestHandler):
    """GET /token?service=…&scope=… as the Docker token auth spec describes."""

    def do_GET(self) -> None:
        owner = cast(_TokenHTTPServer, self.server).owner
        url = urllib.parse.urlsplit(self.path)
        if url.path != "/token":
            self._reply(404, {"errors": [{"code": "NOT_FOUND", "message": "not found"}]})
            return
        query = urllib.parse.parse_qs(url.query)
        scopes = tuple(s for value in query.get("scope", []) for s in value.split())
        status, body = owner.answer(
            self.headers.get("Authorization"), query.get("service", [""])[0], scopes
        )
        self._reply(status, body)

    def do_POST(self) -> None:
        """The OAuth2 form of the token endpoint is not served. Helm tries it first and retries
        a 5xx (the stdlib's 501) with back-off for seconds before falling back to GET; a 405
        makes it fall back at once, as it does with registries whose realm speaks GET only."""
        self._reply(405, {"errors": [{"code": "UNSUPPORTED", "message": "use GET"}]})

    def _reply(self, status: int, body: Mapping[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        if status == 401:
            self.send_header("WWW-Authenticate", 'Basic realm="nvcf-test-token"')
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


class TokenServer:
    """A tiny Docker registry token server on 127.0.0.1 (standard-library HTTP in a thread).

    HTTP basic credentials of `users` get an RS256 JWT granting the requested repository
    actions their TokenUser allows; anonymous requests get a token without access; wrong
    credentials get 401. The signing key's self-signed certificate is written to
    `directory/token-cert.pem` (the registry's rootcertbundle) and sent in the `x5c` header.
    """

    def __init__(
        self,
        directory: Path,
        users: Mapping[str, TokenUser],
        *,
        service: str = "nvcf-test-registry",
        issuer: str = "nvcf-test-token-issuer",
        lifetime: int = 300,
    ) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import rsa
        from cryptography.x509.oid import NameOID

        self.users = dict(users)
        self.service = service
        self.issuer = issuer
        self.lifetime = lifetime
        self.requests: list[TokenRequest] = []
        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        now = datetime.datetime.now(datetime.UTC)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)])
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self._x5c = base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()
        directory.mkdir(parents=True, exist_ok=True)
        self.cert_path = directory / "token-cert.pem"
        self.cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        self._server: _TokenHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def realm(self) -> str:
        return f"http://127.0.0.1:{self.port}/token"

    def registry_auth(self) -> dict[str, str]:
        """The `auth: token:` section of a registry config trusting this server."""
        if self.port == 0:
            raise RuntimeError("start the token server before the registry that uses it")
        return {
            "realm": self.realm,
            "service": self.service,
            "issuer": self.issuer,
            "rootcertbundle": str(self.cert_path),
        }

    def start(self) -> None:
        server = _TokenHTTPServer(("127.0.0.1", self.port), _TokenHandler)
        server.owner = self
        self.port = int(server.server_address[1])
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="token-server",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop serving; the realm URL then refuses connections (the port is kept)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _user(self, authorization: str | None) -> tuple[bool, str | None]:
        """(valid, username): anonymous is (True, None); bad credentials are (False, …)."""
        if authorization is None:
            return True, None
        scheme, _, encoded = authorization.partition(" ")
        if scheme.lower() != "basic":
            return False, None
        try:
            username, sep, password = base64.b64decode(encoded).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False, None
        user = self.users.get(username)
        if not sep or user is None or not secrets.compare_digest(user.password, password):
            return False, username or None
        return True, username

    def answer(
        self, authorization: str | None, service: str, scopes: tuple[str, ...]
    ) -> tuple[int, dict[str, object]]:
        """The status and JSON body for one token request."""
        valid, username = self._user(authorization)
        access: list[tuple[str, tuple[str, ...]]] = []
        body: dict[str, object]
        if not valid:
            status, body = 401, {"errors": [{"code": "UNAUTHORIZED", "message": "bad login"}]}
        elif service != self.service:
            status, body = 400, {"errors": [{"code": "DENIED", "message": "unknown service"}]}
        else:
            allowed = self.users[username].actions if username is not None else frozenset()
            for scope in scopes:
                kind, _, rest = scope.partition(":")
                name, _, actions = rest.rpartition(":")
                granted = tuple(a for a in actions.split(",") if a in allowed)
                if kind == "repository" and name and granted:
                    access.append((name, granted))
            token = self.issue(username, access)
            status = 200
            body = {
                "token": token,
                "access_token": token,
                "expires_in": self.lifetime,
                "issued_at": datetime.datetime.now(datetime.UTC).isoformat(),
            }
        self.requests.append(TokenRequest(username, status, scopes, tuple(access)))
        return status, body

    def issue(self, username: str | None, access: list[tuple[str, tuple[str, ...]]]) -> str:
        """A signed JWT for `username` granting `access` [(repository, actions)]."""
        import jwt

        now = int(time.time())
        claims = {
            "iss": self.issuer,
            "sub": username or "",
            "aud": self.service,
            "exp": now + self.lifetime,
            "nbf": now - 5,
            "iat": now,
            "jti": secrets.token_hex(16),
            "access": [
                {"type": "repository", "name": name, "actions": list(actions)}
                for name, actions in access
            ],
        }
        return jwt.encode(claims, self._key, algorithm="RS256", headers={"x5c": [self._x5c]})
