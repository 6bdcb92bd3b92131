"""Real local OCI registries (Debian's `docker-registry`) and helpers to push Helm charts to them.

Used by the pytest fixtures in tests/charts/conftest.py; plain functions so other suites and
scripts can start registries too.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

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


@dataclass
class RegistryServer:
    """A running registry; `host` is "127.0.0.1:PORT"."""

    host: str
    root: Path
    log_path: Path
    process: subprocess.Popen[bytes]
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    @property
    def auth(self) -> bool:
        return self.username is not None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def blob_gets(self, digest: str) -> int:
        """How many successful GETs of blob `digest` the registry's access log shows."""
        pattern = re.compile(rf'"GET /v2/[^ ]+/blobs/{re.escape(digest)} HTTP/[0-9.]+" 200 ')
        return len(pattern.findall(self.log_text()))

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


def _config(root: Path, port: int, htpasswd_path: Path | None) -> dict[str, object]:
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
    return config


def start_registry(
    tmpdir: Path, *, htpasswd: tuple[str, str] | None = None, attempts: int = 3
) -> RegistryServer:
    """Start a registry with its own config under `tmpdir`; `htpasswd` = (username, password)."""
    binary = ensure_binaries()
    tmpdir.mkdir(parents=True, exist_ok=True)
    htpasswd_path: Path | None = None
    if htpasswd is not None:
        htpasswd_path = tmpdir / "htpasswd"
        htpasswd_path.write_text(htpasswd_line(*htpasswd) + "\n")
    last_error = ""
    for attempt in range(attempts):
        port = _free_port()
        config_path = tmpdir / "config.yml"
        config_path.write_text(yaml.safe_dump(_config(tmpdir, port, htpasswd_path)))
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
            log_path=log_path,
            process=process,
            username=htpasswd[0] if htpasswd else None,
            password=htpasswd[1] if htpasswd else None,
        )
        if _wait_ready(server):
            return server
        server.stop()
        last_error = server.log_text()[-2000:]
    raise RegistryUnavailable(f"docker-registry did not start: {last_error}")


def _wait_ready(server: RegistryServer) -> bool:
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
