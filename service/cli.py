"""`nvcf-server` console script: serve (default), invoke, migrate, create-key, check-catalog.

The servers run on uvicorn from an import string (`serve_app`, `invoke_app`: application
factories, `HttpProtocol`: the bounded HTTP protocol), so that `nvcf-server invoke --processes
N` can use uvicorn's own multi-process mode: the port is bound once and shared by N spawned
processes, each building its own application (its own replica id, queues in Redis) from the
same settings; SIGTERM to the parent stops them all.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import os
import re
import socket
import sys
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from service.assets.signing import STORAGE_PREFIX
from service.backends.worker_utils_pod import DEFAULT_PORT as DEFAULT_WORKER_UTILS_PORT
from service.core.durations import parse_timedelta
from service.core.numbers import natural
from service.core.settings import Settings, settings_error_line

if TYPE_CHECKING:
    from service.core.deadline import BodyDeadlineMiddleware
    from service.core.server import ConnectionLimits

#: the most processes `invoke --processes` (and NVCF_INVOKE_PROCESSES) may start
MAX_PROCESSES = 64

#: the short form `30d`; its unit letter is the ISO-8601 designator, in the time part or not
_DURATION = re.compile(r"^([0-9]+)([smhdw])\Z")


def parse_expiry(value: str) -> timedelta:
    m = _DURATION.match(value.strip().lower())
    if not m or not natural(m.group(1), max_digits=9):
        raise argparse.ArgumentTypeError(f"'{value}' is not a duration like 30d, 12h, 90m or 2w")
    number, unit = m.group(1), m.group(2).upper()
    return parse_timedelta(f"PT{number}{unit}" if unit in "HMS" else f"P{number}{unit}")


def parse_processes(value: str) -> int:
    number = natural(value.strip(), max_digits=2)
    if number is None or not 1 <= number <= MAX_PROCESSES:
        raise argparse.ArgumentTypeError(
            f"'{value}' is not a number of processes from 1 to {MAX_PROCESSES}"
        )
    return number


def positive_int(value: str) -> int:
    number = natural(value.strip(), max_digits=18)
    if number is None or number < 1:
        raise argparse.ArgumentTypeError(f"'{value}' is not a positive whole number")
    return number


def _settings() -> Settings:
    try:
        return Settings()
    except (ValidationError, ValueError) as exc:
        print(f"nvcf-server: {settings_error_line(exc)}", file=sys.stderr)
        raise SystemExit(2) from None


def _configure_logging(settings: Settings) -> None:
    from service.core.logs import configure_logging

    configure_logging(settings.log_format)


def _say(settings: Settings, message: str, *, level: int = logging.INFO) -> None:
    """A line for the operator: printed as is, or a log record when every line must be JSON."""
    if settings.log_format == "json":
        logging.getLogger("nvcf.server").log(level, message)
    else:
        print(f"nvcf-server: {message}", file=sys.stderr if level > logging.INFO else sys.stdout)


def cmd_serve(args: argparse.Namespace) -> int:
    return _run_server(args, invocation_only=False)


def cmd_invoke(args: argparse.Namespace) -> int:
    """The invocation plane alone (pexec, exec, status, queues, transparent mode)."""
    return _run_server(args, invocation_only=True)


def _run_server(args: argparse.Namespace, *, invocation_only: bool) -> int:
    from service.core.tls import TlsError

    settings = _settings()
    processes = 1
    if invocation_only:
        processes = args.processes or settings.invoke_processes
        if processes > 1 and not settings.redis_url:
            print(
                f"nvcf-server: {processes} invocation processes need NVCF_REDIS_URL: each "
                "process is its own replica, and replicas share their queues, in-flight counts "
                "and rate-limit counters only through Redis (in-process dispatch cannot be "
                "shared); set it, or run one process",
                file=sys.stderr,
            )
            return 2
    notes: list[str] = []
    try:
        tls = _tls_files(args, settings, notes)  # before the slow imports: fails fast
    except TlsError as exc:
        print(f"nvcf-server: {exc}", file=sys.stderr)
        return 2

    import uvicorn

    from service.clusters.catalog import CatalogError, load_catalog
    from service.core.server import uvicorn_keepalive

    _configure_logging(settings)  # after the imports, as before: they log set-up noise
    for note in notes:
        _say(settings, note)
    try:
        load_catalog(settings.clusters_file)  # fail before binding the port, naming the line
    except CatalogError as exc:
        _say(settings, str(exc), level=logging.ERROR)
        return 2
    limits = _limits(settings)
    if limits.max_connections < settings.http_max_connections:
        _say(
            settings,
            f"at most {limits.max_connections} connections at once "
            f"(NVCF_HTTP_MAX_CONNECTIONS={settings.http_max_connections} does not fit the "
            "open-file limit)",
            level=logging.WARNING,
        )
    if processes > 1 and settings.auto_migrate:
        # Once, here: N processes migrating one database at once would race.
        from service.core import migrate

        Path(settings.data_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
        migrate.upgrade(settings.effective_database_url)
        os.environ["NVCF_AUTO_MIGRATE"] = "false"  # the spawned processes inherit it
    if processes > 1:
        os.environ["NVCF_INVOKE_PROCESSES"] = str(processes)  # each process knows it is one
    grpc = settings.grpc_enabled and (invocation_only or settings.invoke_enabled)
    # Ports in use stop start-up here, in one line naming the setting, rather than in every
    # process's start with a traceback. (The gRPC listener logs its address once it is bound.)
    taken = _in_use(args.host, args.port, "--port")
    if taken is None and grpc:
        grpc_port = settings.grpc_port
        taken = _in_use(settings.grpc_host or args.host, grpc_port, f"NVCF_GRPC_PORT={grpc_port}")
    if taken is not None:
        _say(settings, taken, level=logging.ERROR)
        return 2
    scheme = "https" if tls else "http"
    what = "the invocation plane" if invocation_only else "serving"
    each = f" ({processes} processes)" if processes > 1 else ""
    _say(settings, f"{what} on {scheme}://{_url_host(args.host)}:{args.port}{each}")
    if grpc:
        _grpc_like_http(settings, args.host, tls)
    sys.stdout.flush()
    uvicorn.run(
        "service.cli:invoke_app" if invocation_only else "service.cli:serve_app",
        factory=True,
        workers=processes,
        host=args.host,
        port=args.port,
        http="service.cli:HttpProtocol",
        timeout_keep_alive=uvicorn_keepalive(limits),
        log_level="warning",
        log_config=None,  # its loggers go through the root handler of _configure_logging
        access_log=False,
        # on every answer the server writes, its own refusals and the front door's included
        headers=[("X-Content-Type-Options", "nosniff")],
        ssl_certfile=str(tls[0]) if tls else None,
        ssl_keyfile=str(tls[1]) if tls else None,
    )
    return 0


def _in_use(host: str, port: int, setting: str) -> str | None:
    """Why `host:port` cannot be listened on (None: it can), as the servers bind it
    (SO_REUSEADDR: a port whose last connections linger in TIME_WAIT is free)."""
    if port == 0:
        return None  # any free port
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), port))
        except OSError as exc:
            reason = "in use (another server on this machine?)"
            if exc.errno != errno.EADDRINUSE:
                reason = f"not available: {exc.strerror or exc}"
            return f"{_url_host(host)}:{port} is {reason}; choose another port ({setting})"
    return None


def _grpc_like_http(settings: Settings, host: str, tls: tuple[Path, Path] | None) -> None:
    """The gRPC listener binds the HTTP server's host and serves its certificate unless its
    own settings say otherwise (through the environment: each serving process reads it)."""
    if settings.grpc_host is None:
        os.environ["NVCF_GRPC_HOST"] = host
    if settings.grpc_tls_cert is None and tls is not None:
        os.environ["NVCF_GRPC_TLS_CERT"] = str(tls[0])
        os.environ["NVCF_GRPC_TLS_KEY"] = str(tls[1])


def _limits(settings: Settings) -> ConnectionLimits:
    from service.core.server import ConnectionLimits, connection_cap, soft_fd_limit

    return ConnectionLimits(
        header_timeout=settings.http_header_timeout,
        body_timeout=settings.http_body_timeout,
        keepalive_timeout=settings.http_keepalive_timeout,
        max_connections=connection_cap(settings.http_max_connections, soft_fd_limit()),
        max_head_bytes=settings.http_max_head_bytes,
        max_headers=settings.http_max_headers,
        long_body_prefix=STORAGE_PREFIX + "/",
        long_body_timeout=settings.asset_upload_timeout_seconds,
        send_timeout=settings.http_send_timeout,
    )


def serve_app() -> BodyDeadlineMiddleware:
    """The API server's application, built in the process that serves it."""
    return _process_app(invocation_only=False)


def invoke_app() -> BodyDeadlineMiddleware:
    """The invocation plane's application, built in each process that serves it."""
    return _process_app(invocation_only=True)


def _process_app(*, invocation_only: bool) -> BodyDeadlineMiddleware:
    from service.app import create_app
    from service.core.deadline import BodyDeadlineMiddleware
    from service.core.server import freeze_startup_objects

    settings = _settings()
    _configure_logging(settings)  # a spawned process starts with none
    app: Any = create_app(settings, invocation_only=invocation_only)
    if invocation_only and settings.invoke_processes > 1:
        app = _ExitOnFailedStart(app)
    freeze_startup_objects(settings.gc_freeze)
    return BodyDeadlineMiddleware(
        app,
        timeout=settings.http_body_timeout,
        long=(STORAGE_PREFIX + "/", settings.asset_upload_timeout_seconds),
    )


class _ExitOnFailedStart:
    """One of several processes whose start failed (database or Redis unreachable, …) exits
    with uvicorn's start-up failure status, on which uvicorn's parent stops every process
    instead of starting a replacement that would fail alike, again and again."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def watched(message: Any) -> None:
            await send(message)
            if message["type"] == "lifespan.startup.failed":
                from uvicorn.config import STARTUP_FAILURE

                logging.shutdown()  # the failure's record written out first
                os._exit(STARTUP_FAILURE)

        await self.app(scope, receive, watched)


def __getattr__(name: str) -> Any:
    """`HttpProtocol`: uvicorn's HTTP protocol bounded by this process's settings (core/
    server.py), looked up by uvicorn in each serving process from its import string (a class
    made at run time cannot be handed to a spawned process)."""
    if name == "HttpProtocol":
        from service.core.server import bounded_protocol

        return bounded_protocol(_limits(_settings()))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _tls_files(
    args: argparse.Namespace, settings: Settings, notes: list[str]
) -> tuple[Path, Path] | None:
    """The certificate and key to serve HTTPS with (None: plain HTTP), checked before the port
    is bound; a self-signed pair is made (or reused) in the data directory, and what to tell
    the operator about it is added to `notes` (said once logging is set up)."""
    from service.core.tls import TlsError, check_pair, ensure_self_signed, hosts_for

    if args.tls_self_signed:
        if args.tls_cert or args.tls_key:
            raise TlsError("--tls-self-signed cannot be combined with --tls-cert/--tls-key")
        made = ensure_self_signed(Path(settings.data_dir), hosts_for(args.host))
        check_pair(made.cert, made.key)
        how = "generated" if made.generated else "reusing"
        notes.append(f"{how} self-signed TLS certificate {made.cert}")
        notes.append(f"  SHA-256 fingerprint {made.fingerprint}")
        notes.append(
            f"  trust it in clients: REQUESTS_CA_BUNDLE={made.cert} (ngcsdk, "
            f"requests), SSL_CERT_FILE={made.cert} (nvcf-cli, httpx, OpenSSL), "
            f"curl --cacert {made.cert}"
        )
        return made.cert, made.key
    if bool(args.tls_cert) != bool(args.tls_key):
        raise TlsError("--tls-cert and --tls-key must be given together")
    if not args.tls_cert:
        return None
    cert, key = Path(args.tls_cert), Path(args.tls_key)
    check_pair(cert, key)
    return cert, key


def cmd_migrate(args: argparse.Namespace) -> int:
    from service.core import migrate

    settings = _settings()
    migrate.upgrade(settings.effective_database_url)
    print("nvcf-server: database is at the latest schema")
    return 0


def cmd_create_key(args: argparse.Namespace) -> int:
    from service.auth.service import create_api_key
    from service.core import migrate
    from service.core.db import make_engine, make_sessionmaker
    from service.core.errors import DomainError

    settings = _settings()
    scope_list = [s.strip() for s in args.scopes.split(",") if s.strip()]

    async def run() -> str:
        url = settings.effective_database_url
        if settings.auto_migrate:
            await asyncio.to_thread(migrate.upgrade, url)
        engine = make_engine(url)
        try:
            async with make_sessionmaker(engine)() as session, session.begin():
                key, _ = await create_api_key(
                    session,
                    account_id=args.account,
                    scopes=scope_list,
                    expires_in=args.expires_in,
                    description=args.description,
                    operator=True,
                )
                return key
        finally:
            await engine.dispose()

    try:
        key = asyncio.run(run())
    except DomainError as exc:
        print(f"nvcf-server: {exc.detail}", file=sys.stderr)
        for e in exc.errors:
            print(f"  {e.field}: {e.message}", file=sys.stderr)
        return 2
    print(key)
    return 0


def cmd_check_catalog(args: argparse.Namespace) -> int:
    from service.clusters.catalog import check_catalog

    problems = check_catalog(Path(args.file))
    for line in problems:
        print(line, file=sys.stderr)
    if problems:
        return 1
    print(f"{args.file}: catalog is valid")
    return 0


def cmd_worker_utils(args: argparse.Namespace) -> int:
    from service.assets.worker_utils import Limits, run

    if args.task_results_dir is not None:
        return task_utils(args)
    if args.worker_port is None:
        print(
            "worker-utils: give --worker-port (a function's pod) or --task-results-dir and "
            "--task-progress-file (a task's pod)",
            file=sys.stderr,
        )
        return 2
    run(
        host=args.host,
        port=args.port,
        worker_port=args.worker_port,
        mount=Path(args.mount),
        limits=Limits(
            max_asset_bytes=args.max_asset_bytes,
            max_result_bytes=args.max_result_bytes,
            max_result_files=args.max_result_files,
            timeout=args.timeout,
            worker_timeout=args.worker_timeout,
        ),
    )
    return 0


def task_utils(args: argparse.Namespace) -> int:
    from service.assets.task_files import TaskLimits, run

    if args.task_progress_file is None:
        print("worker-utils: --task-results-dir needs --task-progress-file", file=sys.stderr)
        return 2
    run(
        host=args.host,
        port=args.port,
        progress_file=Path(args.task_progress_file),
        results_dir=Path(args.task_results_dir),
        limits=TaskLimits(
            max_progress_bytes=args.max_progress_bytes,
            max_result_bytes=args.max_result_bytes,
            max_result_files=args.max_result_files,
            timeout=args.timeout,
            linger=args.linger,
        ),
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nvcf-server", description=__doc__)
    sub = parser.add_subparsers(dest="command")
    serve = sub.add_parser("serve", help="run the API server (default)")
    invoke = sub.add_parser(
        "invoke",
        help="run the invocation plane alone (set NVCF_INVOKE_ENABLED=false on the servers "
        "then); simulated clusters are reached through their `upstream`",
    )
    for p in (parser, serve, invoke):
        p.add_argument("--host", default="127.0.0.1")
        p.add_argument("--port", type=int, default=8080)
        p.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this PEM certificate")
        p.add_argument("--tls-key", metavar="FILE", help="the private key of --tls-cert (PEM)")
        p.add_argument(
            "--tls-self-signed",
            action="store_true",
            help="serve HTTPS with a self-signed certificate for localhost, made once in the "
            "data directory (tls/) and reused",
        )
    invoke.add_argument(
        "--processes",
        type=parse_processes,
        default=None,
        metavar="N",
        help="serve on the one port from N processes, each its own replica (needs "
        "NVCF_REDIS_URL when N > 1); default: NVCF_INVOKE_PROCESSES, else 1",
    )
    serve.set_defaults(func=cmd_serve)
    invoke.set_defaults(func=cmd_invoke)
    sub.add_parser("migrate", help="apply database migrations").set_defaults(func=cmd_migrate)
    key = sub.add_parser("create-key", help="create an API key and print it once")
    key.add_argument("--account", required=True)
    key.add_argument("--scopes", required=True, help="comma-separated scope names")
    key.add_argument("--expires-in", type=parse_expiry, default=None, help="e.g. 30d, 12h")
    key.add_argument("--description", default=None)
    key.set_defaults(func=cmd_create_key)
    cat = sub.add_parser("check-catalog", help="validate a cluster catalog file")
    cat.add_argument("file")
    cat.set_defaults(func=cmd_check_catalog)
    utils = sub.add_parser(
        "worker-utils",
        help="the sidecar beside a function's worker in its pod: fetches input assets, "
        "uploads large results, reports progress; in a task's pod (--task-results-dir): "
        "serves the task's progress file and results (docs/kubernetes.md)",
    )
    # the pod's Service reaches it on the pod's address
    utils.add_argument("--host", default="0.0.0.0")  # noqa: S104
    utils.add_argument("--port", type=int, default=DEFAULT_WORKER_UTILS_PORT)
    utils.add_argument("--worker-port", type=int, help="the worker's own port (a function)")
    utils.add_argument("--task-progress-file", help="a task's NVCT_PROGRESS_FILE_PATH")
    utils.add_argument("--task-results-dir", help="a task's NVCT_RESULTS_DIR")
    utils.add_argument("--max-progress-bytes", type=positive_int, default=64 * 1024)
    utils.add_argument(
        "--linger",
        type=float,
        default=300.0,
        help="a task's pod: seconds its preStop hook waits for the platform's release",
    )
    utils.add_argument("--mount", default="/var/run/nvcf/files", help="the shared volume")
    utils.add_argument("--max-asset-bytes", type=positive_int, default=5 * 1024**3)
    utils.add_argument("--max-result-bytes", type=positive_int, default=5 * 1024**3)
    utils.add_argument("--max-result-files", type=positive_int, default=1000)
    utils.add_argument(
        "--timeout", type=float, default=3600.0, help="seconds per asset fetch or result upload"
    )
    utils.add_argument(
        "--worker-timeout",
        type=float,
        default=3600.0,
        help="seconds the worker may take to start its answer",
    )
    utils.set_defaults(func=cmd_worker_utils)
    parser.set_defaults(func=cmd_serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Everything the server writes (the data dir, the SQLite database and its journals, keys,
    # the chart cache) is for this user alone: directories 0700, files 0600.
    os.umask(0o077)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
