"""Triton's own client (`tritonclient.grpc.aio`, unmodified) calling a `/gRPC` function
through the platform's listener, over a real socket, with a small real Triton-protocol server
as the worker: health, metadata, inference unary and streamed, the worker's error, and the
platform's refusals as the client's `InferenceServerException`."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import InferInput, InferRequestedOutput  # type: ignore[import-untyped]  # no hints
from tritonclient.grpc.aio import InferenceServerClient  # type: ignore[import-untyped]  # no hints
from tritonclient.utils import InferenceServerException  # type: ignore[import-untyped]  # no hints

from tests.support.app import ADMIN_KEY, AppClient, ClientFactory
from tests.support.invocation import deployed, invocation_app
from tests.support.triton_worker import MODEL, TritonWorker

TRITON_FN: dict[str, Any] = {"name": "triton", "inferenceUrl": "/gRPC", "inferencePort": 8001}


@pytest.fixture
async def worker() -> AsyncIterator[TritonWorker]:
    w = await TritonWorker().start()
    try:
        yield w
    finally:
        await w.stop()


@pytest.fixture
async def client(client_factory: ClientFactory, tmp_path: Path, worker: TritonWorker) -> AppClient:
    return await invocation_app(
        client_factory, tmp_path, upstream=worker.url, grpc_enabled=True, grpc_port=0
    )


@pytest.fixture
async def triton(client: AppClient) -> AsyncIterator[InferenceServerClient]:
    triton = InferenceServerClient(url=f"127.0.0.1:{client.app.state.grpc.port}")
    try:
        yield triton
    finally:
        await triton.close()


def headers(fn: dict[str, Any], key: str = ADMIN_KEY) -> dict[str, str]:
    return {"authorization": f"Bearer {key}", "function-id": fn["id"]}


def numbers(values: list[int]) -> InferInput:
    tensor = InferInput("INPUT0", [len(values)], "INT32")
    tensor.set_data_from_numpy(np.array(values, dtype=np.int32))
    return tensor


async def test_triton_health_metadata_and_inference_through_the_platform(
    client: AppClient, triton: InferenceServerClient, worker: TritonWorker
) -> None:
    fn = await deployed(client, **TRITON_FN)
    h = headers(fn)
    assert await triton.is_server_live(headers=h) is True
    assert await triton.is_server_ready(headers=h) is True
    assert await triton.is_model_ready(MODEL, headers=h) is True
    assert await triton.is_model_ready("absent", headers=h) is False
    server = await triton.get_server_metadata(headers=h, as_json=True)
    assert server["name"] == "triton"
    meta = await triton.get_model_metadata(MODEL, headers=h, as_json=True)
    assert meta["name"] == MODEL
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "INT32", "shape": ["-1"]}]
    result = await triton.infer(
        MODEL, [numbers([1, 2, 3])], outputs=[InferRequestedOutput("OUTPUT0")], headers=h
    )
    assert result.as_numpy("OUTPUT0").tolist() == [2, 4, 6]
    seen = worker.calls[-1]
    assert seen["nvcf-function-id"] == fn["id"]
    assert "authorization" not in seen


async def test_triton_streamed_inference_through_the_platform(
    client: AppClient, triton: InferenceServerClient
) -> None:
    fn = await deployed(client, **TRITON_FN)

    async def requests() -> AsyncIterator[dict[str, Any]]:
        for n in range(3):
            yield {"model_name": MODEL, "inputs": [numbers([n, 10 * n])], "request_id": str(n)}
        yield {"model_name": "absent", "inputs": [numbers([0])]}

    answers: list[str | list[int]] = []
    async for result, error in triton.stream_infer(requests(), headers=headers(fn)):
        if error is not None:
            answers.append(str(error))
        else:
            answers.append(result.as_numpy("OUTPUT0").tolist())
    assert answers[:3] == [[0, 0], [2, 20], [4, 40]]
    assert "unknown model: 'absent'" in answers[3]


async def test_the_workers_error_and_the_platforms_refusals_reach_the_triton_client(
    client: AppClient, triton: InferenceServerClient
) -> None:
    fn = await deployed(client, **TRITON_FN)
    with pytest.raises(InferenceServerException) as info:
        await triton.get_model_metadata("absent", headers=headers(fn))
    assert info.value.status() == "StatusCode.NOT_FOUND"
    assert "unknown model: 'absent'" in info.value.message()
    with pytest.raises(InferenceServerException) as info:
        await triton.is_server_live(headers={"function-id": fn["id"]})
    assert info.value.status() == "StatusCode.UNAUTHENTICATED"
    with pytest.raises(InferenceServerException) as info:
        await triton.is_server_live(headers=headers({"id": str(uuid.uuid4())}))
    assert info.value.status() == "StatusCode.NOT_FOUND"
    http_fn = await deployed(client)
    with pytest.raises(InferenceServerException) as info:
        await triton.is_server_live(headers=headers(http_fn))
    assert info.value.status() == "StatusCode.FAILED_PRECONDITION"
    assert "HTTP function" in info.value.message()
