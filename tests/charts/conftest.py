"""Chart pipeline test fixtures; registry logic lives in tests/support/registry.py."""

from __future__ import annotations

import hashlib
import itertools
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.support.registry import (
    RegistryServer,
    RegistryUnavailable,
    TokenServer,
    TokenUser,
    start_registry,
)

REGISTRY_USER = ("chart-puller", "s3cret-Pa55word")
#: token-auth registries: this account may pull and push every repository ...
TOKEN_USER = ("token-puller", "t0ken-Pa55word")
#: ... and this one has valid credentials but no repository access at all
TOKEN_OUTSIDER = ("token-outsider", "0utsider-Pa55word")


def _registry(
    factory: pytest.TempPathFactory, name: str, htpasswd: tuple[str, str] | None = None
) -> Iterator[RegistryServer]:
    try:
        server = start_registry(factory.mktemp(name), htpasswd=htpasswd)
    except RegistryUnavailable as exc:
        pytest.skip(f"no local OCI registry: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def anon_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    """An anonymous docker-registry on 127.0.0.1 for the whole session."""
    yield from _registry(tmp_path_factory, "registry-anon")


@pytest.fixture(scope="session")
def auth_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    """A docker-registry requiring htpasswd basic auth (user/password: REGISTRY_USER)."""
    yield from _registry(tmp_path_factory, "registry-auth", REGISTRY_USER)


@pytest.fixture
def start_extra_registry(tmp_path: Path) -> Iterator[Callable[[], RegistryServer]]:
    """Start throw-away anonymous registries (e.g. to stop one mid-test); all stopped after."""
    started: list[RegistryServer] = []

    def start() -> RegistryServer:
        try:
            server = start_registry(tmp_path / f"registry-{len(started)}")
        except RegistryUnavailable as exc:
            pytest.skip(f"no local OCI registry: {exc}")
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def _token_registry(directory: Path) -> RegistryServer:
    """A registry using Docker token auth against its own, started TokenServer; the caller
    stops both (see _stop_token_registry)."""
    tokens = TokenServer(
        directory / "token",
        {
            TOKEN_USER[0]: TokenUser(TOKEN_USER[1], frozenset({"pull", "push"})),
            TOKEN_OUTSIDER[0]: TokenUser(TOKEN_OUTSIDER[1], frozenset()),
        },
    )
    tokens.start()
    try:
        return start_registry(directory / "registry", token=tokens, login=TOKEN_USER)
    except RegistryUnavailable as exc:
        tokens.stop()
        pytest.skip(f"no local OCI registry: {exc}")


def _stop_token_registry(server: RegistryServer) -> None:
    server.stop()
    if server.token_server is not None:
        server.token_server.stop()


@pytest.fixture(scope="session")
def token_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    """A docker-registry using bearer-token auth (`auth: token`) against a local token server
    (`.token_server`) that grants TOKEN_USER pull and push, for the whole session."""
    server = _token_registry(tmp_path_factory.mktemp("registry-token"))
    try:
        yield server
    finally:
        _stop_token_registry(server)


@pytest.fixture
def start_token_registry(tmp_path: Path) -> Iterator[Callable[[], RegistryServer]]:
    """Start throw-away token-auth registries with their own token servers (e.g. to stop the
    token server mid-test); all stopped after the test."""
    started: list[RegistryServer] = []

    def start() -> RegistryServer:
        server = _token_registry(tmp_path / f"registry-token-{len(started)}")
        started.append(server)
        return server

    yield start
    for server in started:
        _stop_token_registry(server)


# --- corpus charts pushed to the local registries (API tests) ------------------------------


@dataclass(frozen=True)
class PushedChart:
    """A chart pushed with Helm to `oci://<host>/<namespace>/<name>:<version>`."""

    host: str
    namespace: str
    name: str
    version: str
    digest: str  # manifest digest
    layer_digest: str  # sha256 of the chart archive (the Helm layer blob)

    @property
    def file_url(self) -> str:
        """The NVCF documentation form `oci://…/<name>-<version>.tgz`."""
        return f"oci://{self.host}/{self.namespace}/{self.name}-{self.version}.tgz"

    @property
    def ref_url(self) -> str:
        """The plain OCI reference form `oci://…/<name>:<version>`."""
        return f"oci://{self.host}/{self.namespace}/{self.name}:{self.version}"


def push_archive(
    server: RegistryServer, archive: Path, namespace: str, *, workdir: Path
) -> PushedChart:
    """Push a packaged chart with the Helm engine (as users do) and describe it."""
    import helm_python

    workdir.mkdir(parents=True, exist_ok=True)
    client = helm_python.RegistryClient(
        plain_http=True, credentials_file=workdir / "registry-credentials.json"
    )
    if server.username is not None and server.password is not None:
        client.login(server.host, server.username, server.password, plain_http=True)
    client.push(archive, f"oci://{server.host}/{namespace}")
    with tarfile.open(archive, "r:gz") as tar:
        member = next(
            m for m in tar.getmembers() if m.name.count("/") == 1 and m.name.endswith("/Chart.yaml")
        )
        stream = tar.extractfile(member)
        assert stream is not None
        meta = yaml.safe_load(stream.read())
    name, version = str(meta["name"]), str(meta["version"])
    resolved = client.resolve(f"oci://{server.host}/{namespace}/{name}:{version}")
    digest = resolved.get("digest")
    if not isinstance(digest, str):
        raise RuntimeError(f"helm could not resolve the chart it pushed: {resolved}")
    layer = "sha256:" + hashlib.sha256(archive.read_bytes()).hexdigest()
    return PushedChart(server.host, namespace, name, version, digest, layer)


PushCorpus = Callable[..., PushedChart]


@pytest.fixture(scope="session")
def push_corpus(tmp_path_factory: pytest.TempPathFactory) -> PushCorpus:
    """`push_corpus(server, name, namespace=None, files=None)`: package corpus chart `name`
    (an overlay on inference-ok) and push it; cached per (registry, name, namespace) when no
    `files` override is given. The default namespace is `corpus/<name>`."""
    from tests.charts.test_render import build_chart

    cache: dict[tuple[str, str, str], PushedChart] = {}
    counter = itertools.count()

    def push(
        server: RegistryServer,
        name: str,
        namespace: str | None = None,
        files: dict[str, str] | None = None,
    ) -> PushedChart:
        ns = namespace or f"corpus/{name}"
        key = (server.host, name, ns)
        if files or key not in cache:
            workdir = tmp_path_factory.mktemp(f"push-{next(counter)}")
            archive = build_chart(name, workdir, files)
            pushed = push_archive(server, archive, ns, workdir=workdir / "push")
            if files:
                return pushed
            cache[key] = pushed
        return cache[key]

    return push
