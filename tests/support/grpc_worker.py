"""A real gRPC server playing a gRPC function's worker (a simulated cluster's `upstream`), in
the test's event loop, on a real socket.

Methods of `/test.Echo/` (messages are bytes, no protobufs), plus the standard health service
(grpc.health.v1) answering SERVING:

- `Unary`: the request back; `ServerStream`: the request back `int(request)` times as
  `b"0"`, `b"1"`, ...; `ClientStream`: the requests joined by `b"|"`; `Bidi`: each request
  back as it comes; `QuietBidi`: as `Bidi`, its initial metadata sent with its first answer
  (not before: as servers that say nothing until asked);
- `Fail`: status INVALID_ARGUMENT, details `bad input: <request>`, trailing `x-why: because`;
- `Hold`: waits until `release()` (a test reads `held` to know it arrived), then the request
  back; a cancellation is counted in `cancelled`.

Every call's metadata and deadline (`time_remaining`) are kept in `calls`; every answer
carries initial metadata `x-worker: <name>` and trailing `x-done: yes` (and `x-echo-bin`, the
caller's, when it sent one).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc


def text(value: str | bytes) -> str:
    """A text metadata value read by a client: grpc types every value `str | bytes`, though
    only binary (`-bin`) keys carry bytes."""
    assert isinstance(value, str), value
    return value


@dataclass
class Seen:
    method: str
    metadata: dict[str, str]
    time_remaining: float | None
    #: the binary (`-bin`) metadata
    binary: dict[str, bytes] = field(default_factory=dict)


@dataclass
class GrpcWorker:
    name: str = "worker"
    calls: list[Seen] = field(default_factory=list)
    held: int = 0
    cancelled: int = 0
    server: aio.Server | None = None
    port: int = 0
    _gate: asyncio.Event = field(default_factory=asyncio.Event)
    _arrived: asyncio.Condition = field(default_factory=asyncio.Condition)

    @property
    def url(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"

    async def start(self, port: int = 0) -> GrpcWorker:
        server = aio.server()
        server.add_generic_rpc_handlers((_Handler(self),))
        checker = health.aio.HealthServicer()
        await checker.set("", health_pb2.HealthCheckResponse.SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(checker, server)
        self.port = server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        self.server = server
        return self

    async def stop(self, grace: float | None = None) -> None:
        server, self.server = self.server, None
        if server is not None:
            await server.stop(grace)

    def release(self) -> None:
        self._gate.set()

    async def until_held(self, n: int) -> None:
        async with self._arrived:
            await self._arrived.wait_for(lambda: self.held >= n)

    async def until_cancelled(self, n: int) -> None:
        async with self._arrived:
            await self._arrived.wait_for(lambda: self.cancelled >= n)

    # ------------------------------------------------------------------ the methods

    async def call(
        self, kind: str, requests: AsyncIterator[bytes], context: aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        received_md = context.invocation_metadata() or ()
        metadata = {k: v for k, v in received_md if isinstance(v, str)}
        binary = {k: v for k, v in received_md if isinstance(v, bytes)}
        self.calls.append(Seen(kind, metadata, context.time_remaining(), binary))
        if kind != "QuietBidi":  # its initial metadata goes with its first answer
            await context.send_initial_metadata((("x-worker", self.name),))
        trailing: list[tuple[str, str | bytes]] = [("x-done", "yes")]
        if "x-echo-bin" in binary:
            trailing.append(("x-echo-bin", binary["x-echo-bin"]))
        context.set_trailing_metadata(tuple(trailing))
        if kind in ("Bidi", "QuietBidi"):
            async for message in requests:
                yield message
            return
        received = [m async for m in requests]
        if kind == "Unary":
            yield received[0]
        elif kind == "ServerStream":
            for i in range(int(received[0])):
                yield str(i).encode()
        elif kind == "ClientStream":
            yield b"|".join(received)
        elif kind == "Fail":
            context.set_trailing_metadata((("x-why", "because"),))
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"bad input: {received[0].decode()}"
            )
        elif kind == "Hold":
            async with self._arrived:
                self.held += 1
                self._arrived.notify_all()
            try:
                await self._gate.wait()
            except asyncio.CancelledError:
                async with self._arrived:
                    self.cancelled += 1
                    self._arrived.notify_all()
                raise
            yield received[0]
        else:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"no method {kind}")


class _Handler(grpc.GenericRpcHandler):
    def __init__(self, worker: GrpcWorker) -> None:
        self.worker = worker

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any] | None:
        service, _, kind = details.method.lstrip("/").partition("/")
        if service != "test.Echo":
            return None

        async def behaviour(
            requests: AsyncIterator[bytes], context: aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[bytes]:
            async for message in self.worker.call(kind, requests, context):
                yield message

        return grpc.stream_stream_rpc_method_handler(behaviour)
