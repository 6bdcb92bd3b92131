"""A small real gRPC server speaking Triton's inference protocol (`inference.
GRPCInferenceService`, the messages of `tritonclient.grpc.service_pb2`), as a gRPC function's
worker would (a simulated cluster's `upstream`), registered with grpcio generic handlers.

One model, `double` (version 1): INPUT0 INT32 [-1] -> OUTPUT0 INT32, each element doubled.
`ServerLive`, `ServerReady`, `ModelReady`, `ServerMetadata`, `ModelMetadata`, `ModelInfer`
and `ModelStreamInfer` (one response per request) are served; any other model is NOT_FOUND
with Triton's message. The metadata of every call is kept in `calls`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
from grpc import aio
from tritonclient.grpc import service_pb2 as pb  # type: ignore[import-untyped]  # no hints

MODEL = "double"
SERVICE = "inference.GRPCInferenceService"


@dataclass
class TritonWorker:
    calls: list[dict[str, str]] = field(default_factory=list)
    server: aio.Server | None = None
    port: int = 0

    @property
    def url(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"

    async def start(self) -> TritonWorker:
        server = aio.server()
        server.add_generic_rpc_handlers((self._handlers(),))
        self.port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        self.server = server
        return self

    async def stop(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            await server.stop(None)

    def _seen(self, context: aio.ServicerContext[Any, Any]) -> None:
        md = context.invocation_metadata() or ()
        self.calls.append({k: v for k, v in md if isinstance(v, str)})

    def _handlers(self) -> grpc.GenericRpcHandler:
        def unary(behaviour: Any, request: Any, response: Any) -> grpc.RpcMethodHandler[Any, Any]:
            return grpc.unary_unary_rpc_method_handler(
                behaviour,
                request_deserializer=request.FromString,
                response_serializer=response.SerializeToString,
            )

        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "ServerLive": unary(self.server_live, pb.ServerLiveRequest, pb.ServerLiveResponse),
                "ServerReady": unary(
                    self.server_ready, pb.ServerReadyRequest, pb.ServerReadyResponse
                ),
                "ModelReady": unary(self.model_ready, pb.ModelReadyRequest, pb.ModelReadyResponse),
                "ServerMetadata": unary(
                    self.server_metadata, pb.ServerMetadataRequest, pb.ServerMetadataResponse
                ),
                "ModelMetadata": unary(
                    self.model_metadata, pb.ModelMetadataRequest, pb.ModelMetadataResponse
                ),
                "ModelInfer": unary(self.model_infer, pb.ModelInferRequest, pb.ModelInferResponse),
                "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(
                    self.model_stream_infer,
                    request_deserializer=pb.ModelInferRequest.FromString,
                    response_serializer=pb.ModelStreamInferResponse.SerializeToString,
                ),
            },
        )

    # ------------------------------------------------------------------ the methods

    async def server_live(self, _: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        self._seen(context)
        return pb.ServerLiveResponse(live=True)

    async def server_ready(self, _: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        self._seen(context)
        return pb.ServerReadyResponse(ready=True)

    async def model_ready(self, request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        self._seen(context)
        return pb.ModelReadyResponse(ready=request.name == MODEL)

    async def server_metadata(self, _: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        self._seen(context)
        return pb.ServerMetadataResponse(name="triton", version="2.0.0", extensions=[])

    async def model_metadata(self, request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        self._seen(context)
        await self._known(request.name, context)
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=MODEL,
            versions=["1"],
            platform="python",
            inputs=[tensor(name="INPUT0", datatype="INT32", shape=[-1])],
            outputs=[tensor(name="OUTPUT0", datatype="INT32", shape=[-1])],
        )

    async def model_infer(self, request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        self._seen(context)
        await self._known(request.model_name, context)
        return _doubled(request)

    async def model_stream_infer(
        self, requests: AsyncIterator[Any], context: aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        self._seen(context)
        async for request in requests:
            if request.model_name != MODEL:
                yield pb.ModelStreamInferResponse(error_message=_unknown(request.model_name))
            else:
                yield pb.ModelStreamInferResponse(infer_response=_doubled(request))

    async def _known(self, name: str, context: aio.ServicerContext[Any, Any]) -> None:
        if name != MODEL:
            await context.abort(grpc.StatusCode.NOT_FOUND, _unknown(name))


def _unknown(name: str) -> str:
    return f"Request for unknown model: '{name}' is not found"


def _doubled(request: Any) -> Any:
    values = np.frombuffer(request.raw_input_contents[0], dtype="<i4") * 2
    output = pb.ModelInferResponse.InferOutputTensor(
        name="OUTPUT0", datatype="INT32", shape=[len(values)]
    )
    return pb.ModelInferResponse(
        model_name=MODEL,
        model_version="1",
        id=request.id,
        outputs=[output],
        raw_output_contents=[values.astype("<i4").tobytes()],
    )
