"""Which kind of test services the suite starts: PostgreSQL, the OCI registry and Redis as
containers through `testcontainers` where a Docker engine answers, the local Debian services
(postgres.py, registry.py, redis.py) otherwise.

`NVCF_TEST_SERVICES`:

- `auto` (default): containers when a Docker engine answers a ping within `PROBE_TIMEOUT`
  seconds (and `testcontainers` is installed), the local services otherwise;
- `containers`: containers, and a clear failure at start-up when no engine answers;
- `local`: the local services, without asking Docker anything.

The engine is the one `DOCKER_HOST` names (`unix://…` or `tcp://…`), else the default socket
`/var/run/docker.sock`, as the Docker client and `testcontainers` find it. The probe speaks
HTTP on a plain socket with a deadline, so an engine that does not answer costs at most
`PROBE_TIMEOUT` seconds and never hangs the run. The start functions of each service call
`selected()` and hand back the same server object either way.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import socket
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

ENV = "NVCF_TEST_SERVICES"
MODES = ("auto", "containers", "local")
DEFAULT_SOCKET = "/var/run/docker.sock"
#: seconds the engine probe may take in all (connect, send, answer)
PROBE_TIMEOUT = 2.0

Kind = Literal["containers", "local"]
#: env → None when an engine answered, else why not
Probe = Callable[[Mapping[str, str]], str | None]


class ServicesUnavailable(RuntimeError):
    """`NVCF_TEST_SERVICES` asks for what this machine cannot give (or is not a mode)."""


@dataclass(frozen=True)
class Selection:
    """The kind of services the run uses, and why."""

    kind: Kind
    reason: str


def engine_address(env: Mapping[str, str]) -> str:
    """The Docker engine's address as the Docker client finds it (`DOCKER_HOST`, else the
    default socket)."""
    return env.get("DOCKER_HOST", "").strip() or f"unix://{DEFAULT_SOCKET}"


def _connect(address: str, timeout: float) -> socket.socket:
    url = urllib.parse.urlsplit(address)
    if url.scheme == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(url.path)
        except BaseException:
            sock.close()
            raise
        return sock
    if url.scheme in ("tcp", "http"):
        if url.hostname is None:
            raise OSError(f"no host in {address}")
        return socket.create_connection((url.hostname, url.port or 2375), timeout=timeout)
    raise OSError(f"the probe speaks unix:// and tcp:// only, not {url.scheme}://")


def probe_engine(env: Mapping[str, str], timeout: float = PROBE_TIMEOUT) -> str | None:
    """None when the engine answers `GET /_ping` with 200 within `timeout` seconds in all;
    otherwise why it does not (nothing listens, no answer in time, not an engine)."""
    address = engine_address(env)
    if env.get("DOCKER_TLS_VERIFY"):
        return f"{address} wants TLS (DOCKER_TLS_VERIFY), which the probe does not speak"
    deadline = time.monotonic() + timeout
    try:
        with _connect(address, timeout) as sock:
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            answer = b""
            while len(answer) < 4096:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                sock.settimeout(left)
                chunk = sock.recv(4096)
                if not chunk:
                    break
                answer += chunk
    except TimeoutError:
        return f"{address} did not answer within {timeout:g}s"
    except OSError as exc:
        return f"{address}: {exc.strerror or exc}"
    status = answer.split(b"\r\n", 1)[0].split()
    if len(status) < 2 or status[1] != b"200":
        first = answer.split(b"\r\n", 1)[0][:80].decode(errors="replace")
        return f"{address} is not a Docker engine (answered {first!r})"
    return None


def _containers_possible(env: Mapping[str, str]) -> str | None:
    if importlib.util.find_spec("testcontainers") is None:
        return "testcontainers is not installed (pip install -e '.[dev]')"
    return probe_engine(env)


def select_services(
    env: Mapping[str, str] | None = None, *, probe: Probe = _containers_possible
) -> Selection:
    """The kind `NVCF_TEST_SERVICES` in `env` chooses (see the module docstring); raises
    ServicesUnavailable for `containers` without an engine, or an unknown mode."""
    env = os.environ if env is None else env
    mode = env.get(ENV, "").strip().lower() or "auto"
    if mode not in MODES:
        raise ServicesUnavailable(f"{ENV}={mode!r}: expected one of {', '.join(MODES)}")
    if mode == "local":
        return Selection("local", f"{ENV}=local")
    why_not = probe(env)
    if why_not is None:
        return Selection("containers", f"{ENV}={mode}: a Docker engine answers")
    if mode == "containers":
        raise ServicesUnavailable(f"{ENV}=containers, but no Docker engine can be used: {why_not}")
    return Selection("local", f"{ENV}=auto and no Docker engine: {why_not}")


@functools.cache
def selected() -> Selection:
    """The run's selection, decided once (the first service start or the pytest header)."""
    return select_services()


__all__ = [
    "ENV",
    "MODES",
    "PROBE_TIMEOUT",
    "Selection",
    "ServicesUnavailable",
    "engine_address",
    "probe_engine",
    "select_services",
    "selected",
]
