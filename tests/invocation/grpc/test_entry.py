"""gRPC invocation through the platform: real `grpcio` clients over a real socket to the
listener, a real gRPC server as the worker (a simulated cluster's `upstream`), calls of all
four kinds, metadata both ways, the worker's statuses unchanged, deadlines and cancellation,
and every refusal as its gRPC status."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from service.auth import scopes
from tests.support.api import new_key
from tests.support.app import ADMIN_KEY, AppClient, ClientFactory
from tests.support.grpc_worker import GrpcWorker
from tests.support.invocation import deployed, invocation_app, pexec_url, sample

GRPC_FN = {"name": "grpc-echo", "inferenceUrl": "/gRPC", "inferencePort": 8001}


@pytest.fixture
async def worker() -> AsyncIterator[GrpcWorker]:
    w = await GrpcWorker().start()
    try:
        yield w
    finally:
        w.release()
        await w.stop()


async def grpc_app(
    client_factory: ClientFactory, tmp_path: Path, upstream: str | None, **overrides: Any
) -> AppClient:
    return await invocation_app(
        client_factory,
        tmp_path,
        upstream=upstream,
        grpc_enabled=True,
        grpc_port=0,
        **overrides,
    )


@pytest.fixture
async def client(client_factory: ClientFactory, tmp_path: Path, worker: GrpcWorker) -> AppClient:
    return await grpc_app(client_factory, tmp_path, worker.url)


@pytest.fixture
async def channel(client: AppClient) -> AsyncIterator[aio.Channel]:
    async with aio.insecure_channel(f"127.0.0.1:{client.app.state.grpc.port}") as ch:
        yield ch


def md(fn: dict[str, Any], key: str = ADMIN_KEY, **more: str) -> tuple[tuple[str, str], ...]:
    return (
        ("authorization", f"Bearer {key}"),
        ("function-id", fn["id"]),
        *((k.replace("_", "-"), v) for k, v in more.items()),
    )


def unary(channel: aio.Channel, method: str) -> aio.UnaryUnaryMultiCallable[bytes, bytes]:
    return channel.unary_unary(f"/test.Echo/{method}")


async def status_of(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(aio.AioRpcError) as info:
        await call
    return info.value.code(), info.value.details() or ""


# ---------------------------------------------------------------------- the four kinds


async def test_unary_call_reaches_the_worker_with_metadata_both_ways(
    client: AppClient, channel: aio.Channel, worker: GrpcWorker
) -> None:
    fn = await deployed(client, **GRPC_FN)
    call = unary(channel, "Unary")(
        b"\x00hello\xff", metadata=md(fn, x_custom="kept", function_version_id=fn["versionId"])
    )
    assert await call == b"\x00hello\xff"
    initial = dict(await call.initial_metadata())
    assert initial["x-worker"] == "worker"
    request_id = initial["nvcf-reqid"]
    uuid.UUID(request_id)
    assert dict(await call.trailing_metadata())["x-done"] == "yes"
    assert await call.code() == grpc.StatusCode.OK
    seen = worker.calls[-1].metadata
    assert seen["x-custom"] == "kept"
    assert "authorization" not in seen
    assert seen["nvcf-reqid"] == request_id
    assert seen["nvcf-function-id"] == fn["id"]
    assert seen["nvcf-function-version-id"] == fn["versionId"]
    assert seen["nvcf-ncaid"]
    assert "nvcf-instance-id" in seen
    metrics = (await client.get("/metrics")).text
    assert sample(metrics, "nvcf_invocation_requests_total", function_id=fn["id"]) >= 1


async def test_server_client_and_bidi_streams_pass_every_message(
    client: AppClient, channel: aio.Channel
) -> None:
    fn = await deployed(client, **GRPC_FN)
    server_stream = channel.unary_stream("/test.Echo/ServerStream")(b"4", metadata=md(fn))
    assert [m async for m in server_stream] == [b"0", b"1", b"2", b"3"]

    async def parts() -> AsyncIterator[bytes]:
        for p in (b"a", b"b", b"c"):
            yield p

    client_stream = channel.stream_unary("/test.Echo/ClientStream")(parts(), metadata=md(fn))
    assert await client_stream == b"a|b|c"

    bidi = channel.stream_stream("/test.Echo/Bidi")(metadata=md(fn))
    for p in (b"one", b"two", b"three"):
        await bidi.write(p)
        assert await bidi.read() == p  # each answered before the next is sent
    await bidi.done_writing()
    assert await bidi.read() == aio.EOF
    assert await bidi.code() == grpc.StatusCode.OK


async def test_a_real_protobuf_service_is_served(client: AppClient, channel: aio.Channel) -> None:
    """The standard health service of the worker, through its generated stub."""
    fn = await deployed(client, **GRPC_FN)
    stub = health_pb2_grpc.HealthStub(channel)
    answer = await stub.Check(health_pb2.HealthCheckRequest(service=""), metadata=md(fn))
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
    watch = stub.Watch(health_pb2.HealthCheckRequest(service=""), metadata=md(fn))
    first = await watch.read()
    assert first.status == health_pb2.HealthCheckResponse.SERVING
    watch.cancel()


async def test_the_workers_error_status_and_trailers_reach_the_caller_unchanged(
    client: AppClient, channel: aio.Channel
) -> None:
    fn = await deployed(client, **GRPC_FN)
    call = unary(channel, "Fail")(b"x", metadata=md(fn))
    code, details = await status_of(call)
    assert (code, details) == (grpc.StatusCode.INVALID_ARGUMENT, "bad input: x")
    assert dict(await call.trailing_metadata())["x-why"] == "because"
    assert "nvcf-reqid" in dict(await call.initial_metadata())


async def test_the_callers_deadline_reaches_the_worker(
    client: AppClient, channel: aio.Channel, worker: GrpcWorker
) -> None:
    fn = await deployed(client, **GRPC_FN)
    assert await unary(channel, "Unary")(b"x", metadata=md(fn), timeout=30) == b"x"
    remaining = worker.calls[-1].time_remaining
    assert remaining is not None and 0 < remaining <= 30
    call = unary(channel, "Hold")(b"x", metadata=md(fn), timeout=0.5)
    code, _ = await status_of(call)
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    await _slot_is_free(client, channel, fn)


async def test_a_caller_cancelling_cancels_the_workers_call_and_frees_the_slot(
    client: AppClient, channel: aio.Channel, worker: GrpcWorker
) -> None:
    fn = await deployed(client, **GRPC_FN)
    bidi = channel.stream_stream("/test.Echo/Hold")(metadata=md(fn))
    await bidi.write(b"x")
    await bidi.done_writing()
    await worker.until_held(1)
    bidi.cancel()
    await worker.until_cancelled(1)
    await _slot_is_free(client, channel, fn)


async def _slot_is_free(client: AppClient, channel: aio.Channel, fn: dict[str, Any]) -> None:
    """With maxRequestConcurrency 1 (the default), another call is served (it waits in the
    queue until the slot is free, and would end DEADLINE_EXCEEDED if it never were)."""
    assert await unary(channel, "Unary")(b"next", metadata=md(fn), timeout=30) == b"next"


# ---------------------------------------------------------------------- refusals


async def test_every_refusal_is_its_grpc_status(
    client: AppClient, channel: aio.Channel, client_factory: ClientFactory
) -> None:
    fn = await deployed(client, **GRPC_FN)
    call = unary(channel, "Unary")
    no_credential = (("function-id", fn["id"]),)
    assert (await status_of(call(b"x", metadata=no_credential)))[0] == (
        grpc.StatusCode.UNAUTHENTICATED
    )
    wrong = md(fn, key="nvapi-" + "x" * 60)
    assert (await status_of(call(b"x", metadata=wrong)))[0] == grpc.StatusCode.UNAUTHENTICATED
    no_scope = await new_key(client, [scopes.LIST_FUNCTIONS])
    code, details = await status_of(call(b"x", metadata=md(fn, key=no_scope)))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert scopes.INVOKE_FUNCTION in details
    unknown = {"id": str(uuid.uuid4())}
    assert (await status_of(call(b"x", metadata=md(unknown))))[0] == grpc.StatusCode.NOT_FOUND
    other = await new_key(client, [scopes.INVOKE_FUNCTION], account="other-account")
    code, _ = await status_of(call(b"x", metadata=md(fn, key=other)))
    assert code == grpc.StatusCode.NOT_FOUND
    missing = (("authorization", f"Bearer {ADMIN_KEY}"),)
    code, details = await status_of(call(b"x", metadata=missing))
    assert (code, details) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "the metadata 'function-id' is required",
    )
    code, _ = await status_of(call(b"x", metadata=md(fn, function_version_id="nope")))
    assert code == grpc.StatusCode.INVALID_ARGUMENT


async def test_an_http_function_is_failed_precondition_and_http_pexec_of_grpc_is_400(
    client: AppClient, channel: aio.Channel
) -> None:
    http_fn = await deployed(client)
    code, details = await status_of(unary(channel, "Unary")(b"x", metadata=md(http_fn)))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "HTTP function" in details
    grpc_fn = await deployed(client, **GRPC_FN)
    resp = await client.post(pexec_url(grpc_fn), json={})
    assert resp.status_code == 400, resp.text
    assert "gRPC endpoint" in resp.json()["detail"]


async def test_a_version_not_invocable_is_failed_precondition(
    client: AppClient, channel: aio.Channel
) -> None:
    created = await client.post("/v2/nvcf/functions", json={**GRPC_FN_BODY})
    fn = created.json()["function"]
    code, details = await status_of(
        unary(channel, "Unary")(b"x", metadata=md(fn, function_version_id=fn["versionId"]))
    )
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "INACTIVE" in details


GRPC_FN_BODY = {**GRPC_FN, "containerImage": "nvcr.io/acme/grpc-echo:1.0"}
