"""The gRPC listener: every call to any service and method, whatever its kind (unary,
server-, client- or bidirectional streaming), is a stream of messages passed through as bytes
to a worker of the function its metadata names, through the engine (`Engine.open`).

Metadata as NVCF reads it: `authorization: Bearer <key or invocation token>`, `function-id`
(required), `function-version-id`, `nvcf-reqid` (resume a live session: its instance takes
the call), else the cookie `nvcf-request-id`. A call naming no session joins its
connection's (connections.py); the answer of a connection's first call sets the cookie. The
caller's other metadata reaches the worker with the NVCF request headers of the HTTP entry
(lower-cased: `nvcf-reqid`, `nvcf-function-id`, ...); the answer's initial metadata carries
`nvcf-reqid`. Refusals and failures of the engine are gRPC statuses (statuses.py); the
worker's own status, message and trailing metadata pass unchanged. The
caller's deadline (bounded by the worker timeout) reaches the worker; a caller cancelling
cancels the worker's call; the instance's slot is held until the call ends.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from grpc import aio
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.auth import scopes
from service.auth.caller import MissingScope, caller
from service.auth.service import Authenticator, Principal
from service.backends.worker import WorkerEndpoint
from service.core.errors import BadRequest, DomainError, Forbidden
from service.invocation.engine import GRPC_PATH, Call, Engine, is_grpc
from service.invocation.grpc.channels import METHODS_KEPT, Channels, Lease
from service.invocation.grpc.connections import Key, Pin, Pins
from service.invocation.grpc.statuses import NO_WORKER, not_invocable, status_code
from service.invocation.routing import NotInvocable, Target
from service.invocation.run import Finished, Opened
from service.invocation.sessions import SessionNotFound

if TYPE_CHECKING:
    from service.core.settings import Settings

log = logging.getLogger("nvcf.invocation.grpc")

#: the caller's metadata the entry reads and never forwards; `grpc-*` keys (the protocol's
#: own) and `user-agent` (the channel's own) are not forwarded either
READ_KEYS = frozenset({"authorization", "function-id", "function-version-id", "nvcf-reqid"})
_NOT_FORWARDED = READ_KEYS | {"user-agent", "te", "content-type"}
#: the worker's metadata the caller never gets (the entry sets `nvcf-reqid` itself)
_NOT_RETURNED = frozenset({"nvcf-reqid", "nvcf-status", "content-type", "user-agent"})

Metadata = Iterable[tuple[str, str | bytes]]
#: the cookie naming a session (NVCF's proxy: set on a session's first answer, read when
#: `nvcf-reqid` is not sent, deleted when the session is unknown)
COOKIE = "nvcf-request-id"
#: how NVCF's proxy deletes it (Go's `http.Cookie{MaxAge: -1}`)
FORGET_COOKIE = (("set-cookie", f"{COOKIE}=; Max-Age=0"),)


class GrpcListenError(Exception):
    """The listener cannot serve (its address cannot be bound, its certificate read)."""


@dataclass(frozen=True, slots=True)
class _WorkerCall:
    lease: Lease
    call: aio.StreamStreamCall[bytes, bytes]


def caller_metadata(metadata: Metadata) -> list[tuple[bytes, bytes]]:
    """The caller's metadata the worker receives, as the engine takes headers (bytes; a
    `-bin` value as its raw bytes)."""
    out: list[tuple[bytes, bytes]] = []
    for key, value in metadata:
        name = key.lower()
        if name in _NOT_FORWARDED or name.startswith(("grpc-", ":")):
            continue
        raw = value if isinstance(value, bytes) else value.encode("latin-1")
        out.append((name.encode("latin-1"), raw))
    return out


def worker_metadata(headers: Sequence[tuple[str, str]]) -> list[tuple[str, str | bytes]]:
    """The engine's worker headers as gRPC metadata (keys lower-cased, `-bin` values bytes)."""
    out: list[tuple[str, str | bytes]] = []
    for key, value in headers:
        name = key.lower()
        out.append((name, value.encode("latin-1") if name.endswith("-bin") else value))
    return out


def returned_metadata(metadata: Metadata | None) -> list[tuple[str, str | bytes]]:
    """The worker's (initial or trailing) metadata the caller gets."""
    return [
        (k, v)
        for k, v in metadata or ()
        if k.lower() not in _NOT_RETURNED and not k.lower().startswith(("grpc-", ":"))
    ]


async def grpc_only(target: Target) -> None:
    """The entry's admission check: only a gRPC function is called over gRPC."""
    if not is_grpc(target):
        raise BadRequest(
            detail=f"function {target.function_id} version {target.version_id} is an HTTP "
            f"function (inferenceUrl {target.inference_path}), not a gRPC one (inferenceUrl "
            f"{GRPC_PATH}): invoke it over HTTP"
        )


class _Refused(Exception):
    """A call the entry refuses (bad metadata; a refusal of the engine NVCF words its own
    way)."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing: Metadata = ()) -> None:
        super().__init__(details)
        self.code = code
        self.details = details
        self.trailing = tuple(trailing)


@dataclass(slots=True)
class _Session:
    """Which session a call joins, as the entry found it."""

    #: the connection's pin (None: the call is not pinned, e.g. no peer address)
    key: Key | None
    #: the session came from the connection's pin (not `nvcf-reqid` nor the cookie)
    pinned: bool = False
    #: the pin this call makes (the connection's first call): settled once it is open
    claim: Pin | None = None
    #: the answer sets the cookie (the first call of the connection's session)
    cookie: bool = False


def _cookie_session(raw: Metadata) -> uuid.UUID | None:
    """The session the caller's `nvcf-request-id` cookie names (its `cookie` metadata), if
    any; a value that is not a UUID is refused, and the cookie deleted."""
    found = None
    for key, value in raw:
        if key.lower() != "cookie" or not isinstance(value, str):
            continue
        for part in value.split(";"):
            name, eq, text = part.strip().partition("=")
            if eq and name == COOKIE:
                found = text.strip().strip('"')
    if found is None:
        return None
    try:
        return uuid.UUID(found)
    except ValueError:
        raise _Refused(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"the cookie '{COOKIE}' is not a UUID: {found[:64]!r}",
            FORGET_COOKIE,
        ) from None


def _uuid(metadata: dict[str, str], key: str, *, required: bool = False) -> uuid.UUID | None:
    raw = metadata.get(key)
    if raw is None or not raw.strip():
        if required:
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, f"the metadata '{key}' is required")
        return None
    try:
        return uuid.UUID(raw.strip())
    except ValueError:
        raise _Refused(
            grpc.StatusCode.INVALID_ARGUMENT, f"the metadata '{key}' is not a UUID: {raw[:64]!r}"
        ) from None


class GrpcEntry:
    """The gRPC listener over the engine (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        authenticator: Authenticator,
        sessionmaker: async_sessionmaker[AsyncSession],
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.authenticator = authenticator
        self.sessionmaker = sessionmaker
        self.worker_timeout = settings.invoke_worker_timeout_seconds
        self.channels = Channels(
            limit=settings.grpc_worker_channels,
            idle_seconds=settings.grpc_channel_idle_seconds,
            max_message_bytes=settings.grpc_max_message_bytes,
        )
        self.server: aio.Server | None = None
        #: the sessions of the callers' connections (a call holds one at most for the
        #: worker timeout, a session outlives its last call by its idle time)
        self.pins = Pins(self.worker_timeout + settings.grpc_session_idle_seconds)
        #: `Opened.close` of the calls that just ended (run after the caller got the status)
        self._closing: set[asyncio.Task[None]] = set()
        #: the port bound (`NVCF_GRPC_PORT` 0: the one the system chose)
        self.port = 0

    async def start(self) -> None:
        settings = self.settings
        size = settings.grpc_max_message_bytes
        options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", size),
            ("grpc.max_send_message_length", size),
            # several `nvcf-server invoke` processes share the port; anything else binding
            # it (another server on this host) is an error, not a silent share
            ("grpc.so_reuseport", 1 if settings.invoke_processes > 1 else 0),
        ]
        server = aio.server(options=options)
        server.add_generic_rpc_handlers((_Proxy(self),))
        address = f"{_host(settings.grpc_host or '127.0.0.1')}:{settings.grpc_port}"
        try:
            if settings.grpc_tls_cert is not None:
                credentials = await asyncio.to_thread(
                    _credentials, settings.grpc_tls_cert, settings.grpc_tls_key
                )
                port = server.add_secure_port(address, credentials)
            else:
                port = server.add_insecure_port(address)
        except RuntimeError as exc:
            raise GrpcListenError(f"the gRPC listener cannot bind {address}: {exc}") from exc
        if port == 0:
            raise GrpcListenError(f"the gRPC listener cannot bind {address}")
        self.port = port
        await server.start()
        self.server = server
        self.channels.start()
        how = "plaintext" if settings.grpc_tls_cert is None else "TLS"
        log.info("gRPC invocation on %s (port %d, %s)", address, port, how)

    async def stop(self, grace: float = 5.0) -> None:
        """Stop listening; calls still running get `grace` seconds, then are cancelled."""
        server, self.server = self.server, None
        if server is not None:
            await server.stop(grace)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        await self.channels.aclose()

    # ------------------------------------------------------------------ one call

    async def proxy(
        self, method: str, requests: AsyncIterator[bytes], context: aio.ServicerContext[Any, Any]
    ) -> None:
        """One call, from its metadata to the worker's status."""
        opener = functools.partial(self._open_worker, method, requests, context)
        try:
            call, joins = await self._call(method, context)
            opened = await self._open(call, joins, opener)
        except _Refused as exc:
            await context.abort(exc.code, exc.details, exc.trailing)
        except DomainError as exc:
            await context.abort(status_code(exc.status), exc.detail)
        if isinstance(opened, Finished):
            outcome = opened.outcome
            if opened.no_instance:
                log.info("gRPC call %s: %s", opened.request_id, outcome.error)
                await context.abort(*NO_WORKER)
            await context.abort(status_code(outcome.status), outcome.error or "")
        await self._relay(opened, context, joins)

    async def _call(
        self, method: str, context: aio.ServicerContext[Any, Any]
    ) -> tuple[Call, _Session]:
        """The engine's call of the caller's metadata, and how it joins a session
        (`_Refused`, or the `DomainError` of authentication)."""
        raw = context.invocation_metadata() or ()
        metadata: dict[str, str] = {}
        cookies = False  # (a caller may send several `cookie` entries: no ambiguity there)
        for key, value in raw:
            key = key.lower()
            if key == "cookie":
                cookies = True
            elif key in READ_KEYS:
                if key in metadata:  # which to believe is ambiguous, as over HTTP
                    raise _Refused(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"the metadata '{key}' is given more than once",
                    )
                if isinstance(value, str):
                    metadata[key] = value
        principal = await self._principal(metadata.get("authorization"))
        function_id = _uuid(metadata, "function-id", required=True)
        assert function_id is not None
        version_id = _uuid(metadata, "function-version-id")
        session = _uuid(metadata, "nvcf-reqid")
        if session is None and cookies:
            session = _cookie_session(raw)
        peer = context.peer()
        joins = _Session(
            None
            if not peer
            else (
                peer,
                principal.account_id,
                metadata["function-id"],
                metadata.get("function-version-id", ""),
            )
        )
        if session is None and joins.key is not None:
            session, joins.claim = await self.pins.resolve(joins.key)
            joins.pinned = session is not None
        call = Call(
            principal=principal,
            function_id=function_id,
            version_id=version_id,
            method="POST",
            path=method,
            headers=caller_metadata(raw),
            body=b"",
            check=grpc_only,
            session=session,
        )
        return call, joins

    async def _open(
        self, call: Call, joins: _Session, opener: Any
    ) -> Opened[_WorkerCall] | Finished:
        """`Engine.open` in the call's session. A connection's session that ended is followed
        by a new one, as NVCF's proxy asks for a new worker; a session the call names that
        is not live is NOT_FOUND and deletes the cookie."""
        key = joins.key
        opened: Opened[_WorkerCall] | Finished | None = None
        try:
            try:
                opened = await self.engine.open(call, opener)
            except SessionNotFound as exc:
                if key is not None and call.session is not None:
                    self.pins.forget(key, call.session)
                if not joins.pinned or key is None:
                    raise _Refused(grpc.StatusCode.NOT_FOUND, exc.detail, FORGET_COOKIE) from None
                call = dataclasses.replace(call, session=None)
                joins.pinned, joins.claim = False, self.pins.claim(key)
                opened = await self.engine.open(call, opener)
            if isinstance(opened, Opened):
                joins.cookie = self._joined(opened, joins)
            return opened
        except NotInvocable as exc:
            account = call.principal.account_id
            code, details = not_invocable(exc, call.function_id, call.version_id, account)
            raise _Refused(code, details) from None
        finally:
            if not isinstance(opened, Opened):
                self._unpinned(joins)

    def _joined(self, opened: Opened[_WorkerCall], joins: _Session) -> bool:
        """The call is open: the connection's calls join its session (unless its version
        says per call) once every replica can resume it — at once, not after the worker's
        first answer, which may wait for the caller's next call. True when the answer sets
        the cookie (the first call of the connection's session)."""
        key, claim = joins.key, joins.claim
        if key is None or joins.pinned:
            return False
        pinned = opened.target.connection_sessions
        if claim is None:
            return pinned and self.pins.pin(key, opened.request_id)  # a session the call named
        settle = functools.partial(
            self.pins.settle, key, claim, opened.request_id if pinned else None, keep=True
        )
        if opened.joined.done():
            settle()
        else:
            opened.joined.add_done_callback(lambda _: settle())
        return pinned

    def _unpinned(self, joins: _Session) -> None:
        """The call that was to make its connection's pin did not open: the next one does."""
        if joins.claim is not None and joins.key is not None:
            self.pins.settle(joins.key, joins.claim, None, keep=False)

    async def _principal(self, authorization: str | None) -> Principal:
        try:
            return await caller(
                self.authenticator,
                authorization,
                sessions=self.sessionmaker,
                any_of=(scopes.INVOKE_FUNCTION,),
                invocation=True,
            )
        except MissingScope:
            raise Forbidden(
                detail=f"invoking a function requires the scope '{scopes.INVOKE_FUNCTION}'"
            ) from None

    async def _open_worker(
        self,
        method: str,
        requests: AsyncIterator[bytes],
        context: aio.ServicerContext[Any, Any],
        endpoint: WorkerEndpoint,
        headers: list[tuple[str, str]],
    ) -> _WorkerCall:
        """The worker's call (the engine's opener): a connected channel, or
        `WorkerUnreachable` before anything of the caller's was read."""
        lease = await self.channels.acquire(endpoint)
        remaining = context.time_remaining()
        timeout = self.worker_timeout if remaining is None else min(remaining, self.worker_timeout)
        call: aio.StreamStreamCall[bytes, bytes] = lease.method(method)(
            requests, metadata=aio.Metadata(*worker_metadata(headers)), timeout=timeout
        )
        return _WorkerCall(lease, call)

    async def _relay(
        self, opened: Opened[_WorkerCall], context: aio.ServicerContext[Any, Any], joins: _Session
    ) -> None:
        """The worker's answer to the caller; the slot is released when it ends. Each
        message is written to the caller while the worker's next one is read (each is a
        completion-queue round trip of grpcio's: one after the other they add up). The
        exchange is closed in a task of its own: grpcio sends the caller the status once
        this returns, and the close (the slot, the session, the metrics) runs meanwhile,
        whether the call ended or was cancelled."""
        call = opened.value.call
        status, error = 200, None
        loop = asyncio.get_running_loop()
        reading: asyncio.Task[Any] | None = None  # a read not awaited yet
        try:
            initial = returned_metadata(await call.initial_metadata())
            await opened.joined
            request_id = str(opened.request_id)
            initial.append(("nvcf-reqid", request_id))
            if joins.cookie:
                initial.append(("set-cookie", f"{COOKIE}={request_id}"))
            try:
                reading = loop.create_task(call.read())
                await context.send_initial_metadata(initial)
                message, reading = await reading, None
                while message is not aio.EOF:
                    reading = loop.create_task(call.read())
                    await context.write(message)
                    message, reading = await reading, None
            except aio.AioRpcError as exc:
                status = 499 if exc.code() == grpc.StatusCode.CANCELLED else 500
                context.set_trailing_metadata(returned_metadata(exc.trailing_metadata()))
                await context.abort(exc.code(), exc.details() or "")
            context.set_trailing_metadata(returned_metadata(await call.trailing_metadata()))
        except asyncio.CancelledError:
            status, error = 499, "the caller went away"
            raise
        finally:
            call.cancel()  # no-op once it ended
            if reading is not None:
                reading.cancel()
                reading.add_done_callback(_consumed)
            opened.value.lease.release()
            closing = loop.create_task(opened.close(status, error))
            self._closing.add(closing)
            closing.add_done_callback(self._closed)

    def _closed(self, task: asyncio.Task[None]) -> None:
        self._closing.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("closing a gRPC call failed", exc_info=exc)


def _consumed(task: asyncio.Task[Any]) -> None:
    """A worker read left behind by a caller that went away: its failure is nobody's."""
    if not task.cancelled():
        task.exception()


class _Proxy(grpc.GenericRpcHandler):
    """Every method of every service: a bytes stream both ways to the entry's `proxy`."""

    def __init__(self, entry: GrpcEntry) -> None:
        self.entry = entry
        #: a method's handler, made once (the caller names the method: bounded)
        self.handler = functools.lru_cache(maxsize=METHODS_KEPT)(self._handler)

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any]:
        return self.handler(details.method)

    def _handler(self, method: str) -> grpc.RpcMethodHandler[Any, Any]:
        proxy = self.entry.proxy

        # a function of its own, not a partial of a bound method: grpcio inspects the
        # behaviour on every call, and a function is the quick case
        async def behaviour(
            requests: AsyncIterator[bytes], context: aio.ServicerContext[Any, Any]
        ) -> None:
            await proxy(method, requests, context)

        return grpc.stream_stream_rpc_method_handler(behaviour)


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _credentials(cert: Path, key: Path | None) -> grpc.ServerCredentials:
    if key is None:
        raise GrpcListenError("NVCF_GRPC_TLS_CERT needs NVCF_GRPC_TLS_KEY")
    try:
        pair = (key.read_bytes(), cert.read_bytes())
    except OSError as exc:
        raise GrpcListenError(f"the gRPC listener's certificate cannot be read: {exc}") from exc
    return grpc.ssl_server_credentials([pair])
