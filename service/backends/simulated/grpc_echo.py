"""The built-in simulated worker of gRPC functions: a real gRPC server (grpcio, on a free
port of 127.0.0.1, started at the first call) echoing any method of any service as bytes —
each message the caller sends comes back as it is, so a unary call gets its request back and
a stream gets each of its messages (a client-streaming call of several messages gets several
answers, which a stub expecting one refuses). Its initial metadata names the instance that
answered (`sim-instance-id`, the `nvcf-instance-id` it received; `sim-traceparent`, the
`traceparent` it received) and its trailing metadata
counts the messages (`sim-messages`). One server serves every instance of a simulated
cluster; `SimulatedEndpoint.h2_url` refuses instances the cluster does not run."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc import aio


class GrpcEcho:
    def __init__(self) -> None:
        self._server: aio.Server | None = None
        self._url: str | None = None
        self._lock = asyncio.Lock()

    async def url(self) -> str:
        """`http://127.0.0.1:PORT` of the echo server (started at the first call)."""
        if self._url is not None:
            return self._url
        async with self._lock:
            if self._url is None:
                server = aio.server(options=[("grpc.so_reuseport", 0)])
                server.add_generic_rpc_handlers((_Echo(),))
                port = server.add_insecure_port("127.0.0.1:0")
                await server.start()
                self._server = server
                self._url = f"http://127.0.0.1:{port}"
        return self._url

    async def aclose(self) -> None:
        server, self._server, self._url = self._server, None, None
        if server is not None:
            await server.stop(None)


async def _echo(
    requests: AsyncIterator[bytes], context: aio.ServicerContext[Any, Any]
) -> AsyncIterator[bytes]:
    metadata = dict(context.invocation_metadata() or ())
    instance = metadata.get("nvcf-instance-id", "")
    initial = [("sim-instance-id", str(instance))]
    if "traceparent" in metadata:  # as a worker propagating W3C Trace Context sees it
        initial.append(("sim-traceparent", str(metadata["traceparent"])))
    await context.send_initial_metadata(initial)
    count = 0
    async for message in requests:
        count += 1
        yield message
    context.set_trailing_metadata((("sim-messages", str(count)),))


class _Echo(grpc.GenericRpcHandler):
    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any]:
        return grpc.stream_stream_rpc_method_handler(_echo)
