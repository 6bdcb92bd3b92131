"""Shared fixtures: a real PostgreSQL server, a database per test built by Alembic, app clients,
and an OCI registry with corpus charts pushed to it.

The services run as containers where a Docker engine answers and as local Debian services
otherwise (`NVCF_TEST_SERVICES=auto|containers|local`, tests/support/services.py); the fixtures
are the same either way. Every test that takes `database_url` runs twice: on SQLite and on
PostgreSQL.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import pytest_asyncio
from asgi_lifespan import LifespanManager

from service.app import create_app
from service.auth.scopes import ALL_SCOPES
from service.core import migrate
from service.core.settings import Settings
from tests.support.app import ADMIN_KEY, JWT_SECRET, AppClient, ClientFactory, SettingsFactory
from tests.support.charts import PushCorpus, PushedChart, build_chart, push_archive
from tests.support.postgres import PostgresServer, PostgresUnavailable, start_postgres
from tests.support.redis import RedisServer, RedisUnavailable, start_redis
from tests.support.registry import RegistryServer, RegistryUnavailable, start_registry
from tests.support.s3 import S3Server, S3Unavailable, start_s3
from tests.support.services import ServicesUnavailable, selected

REQUIRE_SERVICES = os.environ.get("NVCF_TEST_REQUIRE_SERVICES") == "1"
# Apps and server processes of tests listen for gRPC only when a test asks (on a free
# port): many of them at once would all claim 10081.
os.environ.setdefault("NVCF_GRPC_ENABLED", "false")


def pytest_configure(config: pytest.Config) -> None:
    """`NVCF_TEST_SERVICES=containers` without a usable Docker engine stops the run at once."""
    try:
        selected()
    except ServicesUnavailable as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_report_header(config: pytest.Config) -> str:
    choice = selected()
    return f"test services: {choice.kind} ({choice.reason})"


#: the threads of a telemetry pipeline (the OpenTelemetry SDK's, and our log batcher's)
_EXPORTER_THREADS = ("Otel", "telemetry-logs")


@pytest.fixture(scope="module", autouse=True)
def _no_exporter_left_running() -> Iterator[None]:
    """Every telemetry pipeline a module's apps and tests built is stopped by the module's end.
    One left running exports for the rest of the session, from another test's process state
    (its retry jitter calls `random` every interval, for one)."""
    before = set(threading.enumerate())
    yield
    left = [
        t for t in threading.enumerate() if t not in before and t.name.startswith(_EXPORTER_THREADS)
    ]
    for thread in left:
        thread.join(30)  # a shut-down pipeline's threads end within its export timeout
    running = sorted(t.name for t in left if t.is_alive())
    assert not running, f"telemetry pipelines left running: {running}"


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer | None]:
    try:
        server = start_postgres()
    except PostgresUnavailable as exc:
        if REQUIRE_SERVICES:
            pytest.fail(f"PostgreSQL is required by `make test` but unavailable: {exc}")
        yield None
        return
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    try:
        server = start_redis(tmp_path_factory.mktemp("redis"))
    except RedisUnavailable as exc:
        if REQUIRE_SERVICES:
            pytest.fail(f"Redis is required by `make test` but unavailable: {exc}")
        pytest.skip(f"Redis is not available on this machine: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """An S3-compatible store (moto's server, a process of its own) for the asset tests."""
    try:
        server = start_s3()
    except S3Unavailable as exc:
        if REQUIRE_SERVICES:
            pytest.fail(f"the S3-compatible test store is required by `make test`: {exc}")
        pytest.skip(f"no S3-compatible test store: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pg_template(pg_server: PostgresServer | None) -> str | None:
    if pg_server is None:
        return None
    with psycopg.connect(pg_server.admin_dsn, autocommit=True) as conn:
        conn.execute("CREATE DATABASE nvcf_template")
    migrate.upgrade(pg_server.url("nvcf_template"))
    return "nvcf_template"


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sqlite-template") / "nvcf.db"
    migrate.upgrade(f"sqlite+aiosqlite:///{path}")
    return path


def _database(request: pytest.FixtureRequest, directory: Path, template: Path) -> Iterator[str]:
    """A fresh database of kind `request.param` (from the migrated templates), dropped after."""
    if request.param == "sqlite":
        target = directory / "nvcf.db"
        shutil.copy(template, target)
        yield f"sqlite+aiosqlite:///{target}"
        return
    server: PostgresServer | None = request.getfixturevalue("pg_server")
    pg_template: str | None = request.getfixturevalue("pg_template")
    if server is None or pg_template is None:
        pytest.skip("PostgreSQL is not available on this machine")
    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(server.admin_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE {pg_template}")
    try:
        yield server.url(name)
    finally:
        with psycopg.connect(server.admin_dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    sqlite_template: Path,
) -> Iterator[str]:
    yield from _database(request, tmp_path, sqlite_template)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def module_database_url(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    sqlite_template: Path,
) -> Iterator[str]:
    """`database_url` shared by every test of a module (see `module_client`)."""
    yield from _database(request, tmp_path_factory.mktemp("module-db"), sqlite_template)


def app_settings(data_dir: Path, database_url: str, **overrides: Any) -> Settings:
    """The settings of the test apps: this database, the test admin key and JWT secret."""
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "database_url": database_url,
        "bootstrap_api_key": ADMIN_KEY,
        "jwt_secret": JWT_SECRET,
        "auto_migrate": False,
        "_env_file": None,
    }
    values.update(overrides)
    return Settings(**values)


@contextlib.asynccontextmanager
async def started_client(settings: Settings, span_exporter: Any = None) -> AsyncIterator[AppClient]:
    """The app of `settings`, its lifespan started, and a client of it with the admin key."""
    app = create_app(settings, span_exporter=span_exporter)
    async with (
        LifespanManager(app, startup_timeout=120, shutdown_timeout=120) as manager,
        AppClient(
            transport=httpx.ASGITransport(app=manager.app),
            base_url="http://nvcf.test",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        ) as c,
    ):
        c.app = app
        yield c


@pytest.fixture
def make_settings(tmp_path: Path, database_url: str) -> SettingsFactory:
    def factory(**overrides: Any) -> Settings:
        data_dir = overrides.pop("data_dir", tmp_path / "data")
        return app_settings(data_dir, database_url, **overrides)

    return factory


@pytest.fixture
async def client_factory(make_settings: SettingsFactory) -> AsyncIterator[ClientFactory]:
    """Start apps (lifespan included) and hand back clients; everything is closed at the end."""
    async with contextlib.AsyncExitStack() as started:

        async def factory(
            settings: Settings | None = None, *, span_exporter: Any = None, **overrides: Any
        ) -> AppClient:
            return await started.enter_async_context(
                started_client(settings or make_settings(**overrides), span_exporter)
            )

        yield factory


@pytest.fixture
async def client(client_factory: ClientFactory) -> AppClient:
    return await client_factory()


@pytest.fixture(scope="module")
def module_settings() -> dict[str, Any]:
    """Overrides of `module_client`'s settings; a module overrides this fixture to change them."""
    return {}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def module_client(
    tmp_path_factory: pytest.TempPathFactory,
    module_database_url: str,
    module_settings: dict[str, Any],
) -> AsyncIterator[AppClient]:
    """One app with the test settings (and `module_settings`) for every test of a module, per
    database (an app costs about a second to build and start). Only for modules whose tests need
    no fresh state: each reads what it made itself, or is refused and checks that nothing
    changed. Its tests run in the module's event loop:
    `pytestmark = pytest.mark.asyncio(loop_scope="module")`.
    """
    data_dir = tmp_path_factory.mktemp("module-app") / "data"
    settings = app_settings(data_dir, module_database_url, **module_settings)
    async with started_client(settings) as c:
        yield c


@pytest.fixture
def tenant() -> str:
    """An account no other test uses (for tests on `tenant_client`)."""
    return f"tenant-{uuid.uuid4().hex[:12]}"


@pytest_asyncio.fixture(loop_scope="module")
async def tenant_client(module_client: AppClient, tenant: str) -> AsyncIterator[AppClient]:
    """`module_client`'s app as a key of the test's own account (`tenant`) holding every scope
    an account can hold: a test on it lists only what it made, though the app is shared."""
    resp = await module_client.post(
        "/v2/nvcf/api-keys", json={"ncaId": tenant, "scopes": list(ALL_SCOPES)}
    )
    assert resp.status_code == 200, resp.text
    async with AppClient(
        transport=httpx.ASGITransport(app=module_client.app),
        base_url=str(module_client.base_url),
        headers={"Authorization": f"Bearer {resp.json()['apiKey']['key']}"},
    ) as c:
        c.app = module_client.app
        yield c


# --- a local OCI registry with corpus charts (tests/charts and tests/deployments) -----------


@pytest.fixture(scope="session")
def anon_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    """An anonymous docker-registry on 127.0.0.1 for the whole session."""
    try:
        server = start_registry(tmp_path_factory.mktemp("registry-anon"))
    except RegistryUnavailable as exc:
        pytest.skip(f"no local OCI registry: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def push_corpus(tmp_path_factory: pytest.TempPathFactory) -> PushCorpus:
    """`push_corpus(server, name, namespace=None, files=None)`: package corpus chart `name`
    (an overlay on inference-ok) and push it; cached per (registry, name, namespace) when no
    `files` override is given. The default namespace is `corpus/<name>`."""
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
