"""Real remote-write receivers for the tests, Debian's binaries (scripts/install-test-services.sh):
`prometheus` with `--web.enable-remote-write-receiver` and `victoria-metrics`, each on a free
port of 127.0.0.1 with its data in a temporary directory, queried back with PromQL
(`GET /api/v1/query`)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

#: seconds a receiver may take to answer its readiness probe
START_TIMEOUT = 60.0
#: Prometheus needs a configuration file: one that scrapes nothing
PROMETHEUS_CONFIG = "global:\n  scrape_interval: 1h\nscrape_configs: []\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(frozen=True)
class Tsdb:
    """A running receiver: where remote write goes, and PromQL."""

    name: str
    port: int

    @property
    def hostport(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def write_url(self) -> str:
        return f"http://{self.hostport}/api/v1/write"

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector of `promql` now: `[{"metric": {labels}, "value": [t, "v"]}]`."""
        resp = httpx.get(
            f"http://{self.hostport}/api/v1/query", params={"query": promql}, timeout=10
        )
        resp.raise_for_status()
        body = resp.json()
        assert body["status"] == "success", body
        return list(body["data"]["result"])


def _command(name: str, port: int, data: Path) -> list[str]:
    if name == "prometheus":
        config = data / "prometheus.yml"
        config.write_text(PROMETHEUS_CONFIG)
        return [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={data / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-remote-write-receiver",
        ]
    return [
        "victoria-metrics",
        f"-httpListenAddr=127.0.0.1:{port}",
        f"-storageDataPath={data / 'vm'}",
        # samples are searchable at once, not after the default second of caching
        "-search.latencyOffset=0s",
        "-search.cacheTimestampOffset=0s",
    ]


@contextmanager
def running(name: str) -> Iterator[Tsdb]:
    """`prometheus` or `victoria-metrics`, started and ready; stopped and removed after."""
    binary = shutil.which(name)
    assert binary is not None, f"{name} is not installed: run scripts/install-test-services.sh"
    data = Path(tempfile.mkdtemp(prefix=f"nvcf-{name}-"))
    port = _free_port()
    ready = "/-/ready" if name == "prometheus" else "/health"
    log = (data / "log").open("wb")  # a file: a pipe nobody reads would fill and block it
    process = subprocess.Popen(_command(name, port, data), stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if process.poll() is not None:
                err = (data / "log").read_text(errors="replace")
                raise RuntimeError(f"{name} exited: {err[-2000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}{ready}", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not become ready within {START_TIMEOUT:g} s")
            time.sleep(0.1)
        yield Tsdb(name, port)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
        shutil.rmtree(data, ignore_errors=True)
