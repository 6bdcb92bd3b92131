"""gRPC invocation through the platform: real `grpcio` clients over a real socket to the
listener, a real gRPC server as the worker (a simulated cluster's `upstream`), calls of all
four kinds, metadata both ways, the worker's statuses unchanged, deadlines and cancellation,
and every refusal as its gRPC status."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy import update

from service.auth import scopes
from service.core.tls import ensure_self_signed
from service.functions.models import FunctionVersion
from tests.support.api import new_key
from tests.support.app import ADMIN_KEY, AppClient, ClientFactory
from tests.support.e2e import deployment
from tests.support.grpc_worker import GrpcWorker, text
from tests.support.invocation import deployed, invocation_app, pexec_url, sample, spec

GRPC_FN: dict[str, Any] = {"name": "grpc-echo", "inferenceUrl": "/gRPC", "inferencePort": 8001}


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


def connection(client: AppClient) -> aio.Channel:
    """A channel on a TCP connection of its own (grpcio shares one between the channels of a
    process that have the same target and options, as if they were one client)."""
    port = client.app.state.grpc.port
    return aio.insecure_channel(
        f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]
    )


def md(fn: dict[str, Any], key: str = ADMIN_KEY, **more: str) -> tuple[tuple[str, str], ...]:
    return (
        ("authorization", f"Bearer {key}"),
        ("function-id", fn["id"]),
        *((k.replace("_", "-"), v) for k, v in more.items()),
    )


def unary(channel: aio.Channel, method: str) -> aio.UnaryUnaryMultiCallable[bytes, bytes]:
    return channel.unary_unary(f"/test.Echo/{method}")


def bidi(channel: aio.Channel, method: str) -> aio.StreamStreamMultiCallable[bytes, bytes]:
    return channel.stream_stream(f"/test.Echo/{method}")


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
    request_id = text(initial["nvcf-reqid"])
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


async def test_binary_metadata_passes_both_ways_unchanged(
    client: AppClient, channel: aio.Channel, worker: GrpcWorker
) -> None:
    fn = await deployed(client, **GRPC_FN)
    raw = bytes(range(256))
    call = unary(channel, "Unary")(b"x", metadata=(*md(fn), ("x-echo-bin", raw)))
    assert await call == b"x"
    assert worker.calls[-1].binary["x-echo-bin"] == raw
    assert dict(await call.trailing_metadata())["x-echo-bin"] == raw


async def test_server_client_and_bidi_streams_pass_every_message(
    client: AppClient, channel: aio.Channel
) -> None:
    fn = await deployed(client, **GRPC_FN)
    server_stream: aio.UnaryStreamMultiCallable[bytes, bytes] = channel.unary_stream(
        "/test.Echo/ServerStream"
    )
    assert [m async for m in server_stream(b"4", metadata=md(fn))] == [b"0", b"1", b"2", b"3"]

    async def parts() -> AsyncIterator[bytes]:
        for p in (b"a", b"b", b"c"):
            yield p

    client_stream: aio.StreamUnaryMultiCallable[bytes, bytes] = channel.stream_unary(
        "/test.Echo/ClientStream"
    )
    assert await client_stream(parts(), metadata=md(fn)) == b"a|b|c"

    both = bidi(channel, "Bidi")(metadata=md(fn))
    for p in (b"one", b"two", b"three"):
        await both.write(p)
        assert await both.read() == p  # each answered before the next is sent
    await both.done_writing()
    assert await both.read() == aio.EOF
    assert await both.code() == grpc.StatusCode.OK


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
    # gRPC rounds the deadline it sends (grpc-timeout) up, by up to a tenth of a second
    assert remaining is not None and 0 < remaining <= 30.5
    call = unary(channel, "Hold")(b"x", metadata=md(fn), timeout=0.5)
    code, _ = await status_of(call)
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    await _slot_is_free(client, channel, fn)


async def test_a_caller_cancelling_cancels_the_workers_call_and_frees_the_slot(
    client: AppClient, channel: aio.Channel, worker: GrpcWorker
) -> None:
    fn = await deployed(client, **GRPC_FN)
    held = bidi(channel, "Hold")(metadata=md(fn))
    await held.write(b"x")
    await held.done_writing()
    await worker.until_held(1)
    held.cancel()
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


async def test_metadata_the_entry_reads_given_twice_is_invalid_argument(
    client: AppClient, channel: aio.Channel
) -> None:
    fn = await deployed(client, **GRPC_FN)
    call = unary(channel, "Unary")
    for key, value in (
        ("function-id", str(uuid.uuid4())),
        ("function-id", fn["id"]),
        ("function-version-id", fn["versionId"]),
        ("authorization", f"Bearer {ADMIN_KEY}"),
    ):
        metadata = (*md(fn, function_version_id=fn["versionId"]), (key, value))
        code, details = await status_of(call(b"x", metadata=metadata))
        assert (code, details) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            f"the metadata '{key}' is given more than once",
        )
    assert await call(b"x", metadata=md(fn, function_version_id=fn["versionId"])) == b"x"


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


async def test_a_version_not_invocable_is_answered_as_nvcfs_api_answers_its_proxy(
    client: AppClient, channel: aio.Channel
) -> None:
    """NVCF's `AuthStatefulWork`: NOT_FOUND for a version neither ACTIVE nor DEGRADING,
    INVALID_ARGUMENT for a DEGRADED one, worded as its API words them and its proxy passes
    them on."""
    created = await client.post("/v2/nvcf/functions", json={**GRPC_FN_BODY})
    fn = created.json()["function"]
    fid, vid, account = fn["id"], fn["versionId"], fn["ncaId"]
    code, details = await status_of(
        unary(channel, "Unary")(b"x", metadata=md(fn, function_version_id=vid))
    )
    assert (code, details) == (
        grpc.StatusCode.NOT_FOUND,
        "failed to open stateful work request: rpc error: code = NotFound desc = "
        f"Function id '{fid}' version '{vid}': Specified function in account '{account}' "
        "is not found",
    )
    code, details = await status_of(unary(channel, "Unary")(b"x", metadata=md(fn)))
    assert code == grpc.StatusCode.NOT_FOUND
    assert f"version 'null': Specified function in account '{account}'" in details
    async with client.app.state.sessionmaker() as session, session.begin():
        await session.execute(
            update(FunctionVersion)
            .where(FunctionVersion.id == uuid.UUID(vid))
            .values(status="DEGRADED")
        )
    code, details = await status_of(
        unary(channel, "Unary")(b"x", metadata=md(fn, function_version_id=vid))
    )
    assert (code, details) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "failed to open stateful work request: rpc error: code = InvalidArgument desc = "
        f"Function id '{fid}': DEGRADED function cannot be invoked",
    )


GRPC_FN_BODY = {**GRPC_FN, "containerImage": "nvcr.io/acme/grpc-echo:1.0"}


async def test_a_message_larger_than_the_bound_is_resource_exhausted(
    client_factory: ClientFactory, tmp_path: Path, worker: GrpcWorker
) -> None:
    client = await grpc_app(client_factory, tmp_path, worker.url, grpc_max_message_bytes=1024)
    fn = await deployed(client, **GRPC_FN)
    async with aio.insecure_channel(f"127.0.0.1:{client.app.state.grpc.port}") as ch:
        assert await unary(ch, "Unary")(b"x" * 1000, metadata=md(fn)) == b"x" * 1000
        code, _ = await status_of(unary(ch, "Unary")(b"x" * 2000, metadata=md(fn)))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_the_functions_rate_limit_is_resource_exhausted(
    client: AppClient, channel: aio.Channel
) -> None:
    fn = await deployed(client, **GRPC_FN, rateLimit={"rateLimit": "1-M"})
    assert await unary(channel, "Unary")(b"x", metadata=md(fn)) == b"x"
    code, _ = await status_of(unary(channel, "Unary")(b"x", metadata=md(fn)))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_a_full_queue_is_resource_exhausted(
    client_factory: ClientFactory, tmp_path: Path, worker: GrpcWorker
) -> None:
    client = await grpc_app(client_factory, tmp_path, worker.url, invoke_queue_max=0)
    fn = await deployed(client, **GRPC_FN)
    async with aio.insecure_channel(f"127.0.0.1:{client.app.state.grpc.port}") as ch:
        held = unary(ch, "Hold")(b"x", metadata=md(fn))
        await worker.until_held(1)
        code, details = await status_of(unary(ch, "Unary")(b"y", metadata=md(fn)))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "queue" in details
        worker.release()
        assert await held == b"x"


async def test_no_worker_in_time_is_deadline_exceeded_as_nvcfs_proxy_says_it(
    client_factory: ClientFactory, tmp_path: Path, worker: GrpcWorker
) -> None:
    client = await grpc_app(
        client_factory,
        tmp_path,
        worker.url,
        invoke_queue_timeout_seconds=0.2,
        autoscale_enabled=False,
    )
    async with aio.insecure_channel(f"127.0.0.1:{client.app.state.grpc.port}") as ch:
        # minInstances 0 and nobody to start an instance: no instance takes it in time
        idle = await deployed(client, **{**GRPC_FN, "name": "idle"}, specs=[spec(minInstances=0)])
        code, details = await status_of(unary(ch, "Unary")(b"z", metadata=md(idle)))
        assert (code, details) == (
            grpc.StatusCode.DEADLINE_EXCEEDED,
            "failed to establish link to worker",
        )


async def test_an_unreachable_worker_is_unavailable(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    gone = await GrpcWorker().start()
    await gone.stop()  # its port now refuses connections
    client = await grpc_app(client_factory, tmp_path, gone.url)
    fn = await deployed(client, **GRPC_FN)
    async with aio.insecure_channel(f"127.0.0.1:{client.app.state.grpc.port}") as ch:
        code, details = await status_of(unary(ch, "Unary")(b"x", metadata=md(fn)))
    assert code == grpc.StatusCode.UNAVAILABLE
    assert "could not be reached" in details
    metrics = (await client.get("/metrics")).text
    assert sample(metrics, "nvcf_invocation_requests_total", outcome="errored") >= 1


async def test_an_unexpected_failure_opening_the_workers_call_is_an_error_that_frees_the_slot(
    client: AppClient, channel: aio.Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever ends a call before it is open ends it as any other failure does (one mapping
    of failures to outcomes): the caller told why, the slot free."""
    fn = await deployed(client, **GRPC_FN)
    channels = client.app.state.grpc.channels
    acquire = channels.acquire
    failures = iter([RuntimeError("a bug")])

    async def once(endpoint: Any) -> Any:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return await acquire(endpoint)

    monkeypatch.setattr(channels, "acquire", once)
    code, details = await status_of(unary(channel, "Unary")(b"x", metadata=md(fn)))
    assert code == grpc.StatusCode.UNAVAILABLE
    assert details == "the request failed: RuntimeError"
    await _slot_is_free(client, channel, fn)


async def test_a_worker_going_away_mid_stream_is_unavailable_and_frees_the_slot(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    worker = await GrpcWorker().start()
    port = worker.port
    client = await grpc_app(client_factory, tmp_path, worker.url)
    fn = await deployed(client, **GRPC_FN)
    async with aio.insecure_channel(f"127.0.0.1:{client.app.state.grpc.port}") as ch:
        stream = bidi(ch, "Bidi")(metadata=md(fn))
        await stream.write(b"a")
        assert await stream.read() == b"a"
        await worker.stop(grace=0)  # the connection is torn down mid-stream
        with pytest.raises(aio.AioRpcError) as info:
            await stream.read()
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        again = await GrpcWorker(name="again").start(port)
        try:
            await _slot_is_free(client, ch, fn)
        finally:
            await again.stop()


async def test_one_slot_two_streams_the_second_waits_until_the_first_ends(
    client: AppClient, channel: aio.Channel, worker: GrpcWorker
) -> None:
    fn = await deployed(client, **GRPC_FN)  # maxRequestConcurrency 1
    first = bidi(channel, "Bidi")(metadata=md(fn))
    await first.write(b"first")
    assert await first.read() == b"first"
    second = bidi(channel, "Bidi")(metadata=md(fn))
    await second.write(b"second")
    dispatcher = client.app.state.invocation.dispatcher
    version = uuid.UUID(fn["versionId"])
    while dispatcher.depth_now(version) < 1:  # noqa: ASYNC110 (the queue has no event)
        await asyncio.sleep(0.01)
    assert len(worker.calls) == 1  # the second waits in the queue, not at the worker
    await first.done_writing()
    assert await first.read() == aio.EOF
    assert await second.read() == b"second"
    assert len(worker.calls) == 2
    await second.done_writing()
    assert await second.code() == grpc.StatusCode.OK


async def test_a_session_resumes_on_its_instance_until_it_ends(
    client_factory: ClientFactory, tmp_path: Path, worker: GrpcWorker
) -> None:
    """With NVCF_GRPC_SESSION_IDLE_SECONDS 0 a session ends with its last call."""
    client = await grpc_app(client_factory, tmp_path, worker.url, grpc_session_idle_seconds=0)
    async with aio.insecure_channel(f"127.0.0.1:{client.app.state.grpc.port}") as channel:
        await _session_resumes_until_it_ends(client, channel, worker)


async def _session_resumes_until_it_ends(
    client: AppClient, channel: aio.Channel, worker: GrpcWorker
) -> None:
    fn = await deployed(
        client, **GRPC_FN, specs=[spec(minInstances=2, maxInstances=2, maxRequestConcurrency=4)]
    )
    session = bidi(channel, "Bidi")(metadata=md(fn))
    await session.write(b"open")
    assert await session.read() == b"open"
    request_id = text(dict(await session.initial_metadata())["nvcf-reqid"])
    instance = worker.calls[-1].metadata["nvcf-instance-id"]
    # a new call on another connection goes to the other instance (fewest in flight) ...
    async with connection(client) as other:
        assert await unary(other, "Unary")(b"new", metadata=md(fn)) == b"new"
    assert worker.calls[-1].metadata["nvcf-instance-id"] != instance
    # ... a resumed one to the session's, as the same request
    for _ in range(3):
        call = unary(channel, "Unary")(b"again", metadata=md(fn, nvcf_reqid=request_id))
        assert await call == b"again"
        assert dict(await call.initial_metadata())["nvcf-reqid"] == request_id
        assert worker.calls[-1].metadata["nvcf-instance-id"] == instance
        assert worker.calls[-1].metadata["nvcf-reqid"] == request_id
    code, details = await status_of(
        unary(channel, "Unary")(b"x", metadata=md(fn, nvcf_reqid=str(uuid.uuid4())))
    )
    assert (code, details.startswith("no existing session found")) == (
        grpc.StatusCode.NOT_FOUND,
        True,
    )
    await session.done_writing()
    assert await session.read() == aio.EOF
    code, _ = await status_of(unary(channel, "Unary")(b"x", metadata=md(fn, nvcf_reqid=request_id)))
    assert code == grpc.StatusCode.NOT_FOUND


async def test_a_session_outlives_its_last_call_for_the_idle_time(
    client: AppClient, channel: aio.Channel, worker: GrpcWorker
) -> None:
    """A client reconnecting after its stream ended resumes the session on its instance
    (the default idle time, 30 s), on a new connection too."""
    fn = await deployed(
        client, **GRPC_FN, specs=[spec(minInstances=2, maxInstances=2, maxRequestConcurrency=4)]
    )
    first = unary(channel, "Unary")(b"first", metadata=md(fn))
    assert await first == b"first"
    request_id = text(dict(await first.initial_metadata())["nvcf-reqid"])
    instance = worker.calls[-1].metadata["nvcf-instance-id"]
    async with aio.insecure_channel(f"127.0.0.1:{client.app.state.grpc.port}") as again:
        for _ in range(4):  # new calls alternate between the instances; resumed ones do not
            call = unary(again, "Unary")(b"back", metadata=md(fn, nvcf_reqid=request_id))
            assert await call == b"back"
            assert worker.calls[-1].metadata["nvcf-instance-id"] == instance
    other = await deployed(client, **{**GRPC_FN, "name": "other"})
    code, _ = await status_of(
        unary(channel, "Unary")(b"x", metadata=md(other, nvcf_reqid=request_id))
    )
    assert code == grpc.StatusCode.NOT_FOUND  # a session is its function's instance's only


# ---------------------------------------------------------------------- a connection's session

TWO = [spec(minInstances=2, maxInstances=2, maxRequestConcurrency=4)]


async def _held(
    channel: aio.Channel, fn: dict[str, Any], worker: GrpcWorker
) -> aio.StreamStreamCall[bytes, bytes]:
    """A stream left open: its instance has a call in flight, the other none."""
    stream = bidi(channel, "Bidi")(metadata=md(fn))
    await stream.write(b"open")
    assert await stream.read() == b"open"
    return stream


async def _end(stream: aio.StreamStreamCall[bytes, bytes]) -> None:
    await stream.done_writing()
    assert await stream.read() == aio.EOF


async def test_a_connection_is_a_session_on_one_instance_and_its_first_answer_sets_the_cookie(
    client: AppClient, channel: aio.Channel, worker: GrpcWorker
) -> None:
    fn = await deployed(client, **GRPC_FN, specs=TWO)
    held = await _held(channel, fn, worker)
    initial = dict(await held.initial_metadata())
    request_id = text(initial["nvcf-reqid"])
    assert initial["set-cookie"] == f"nvcf-request-id={request_id}"
    instance = worker.calls[-1].metadata["nvcf-instance-id"]
    # the other instance has nothing in flight: the connection's calls go to its own all the same
    for _ in range(3):
        call = unary(channel, "Unary")(b"again", metadata=md(fn))
        assert await call == b"again"
        initial = dict(await call.initial_metadata())
        assert initial["nvcf-reqid"] == request_id
        assert "set-cookie" not in initial
        assert worker.calls[-1].metadata["nvcf-instance-id"] == instance
        assert worker.calls[-1].metadata["nvcf-reqid"] == request_id
    # another connection is a session of its own, on the other instance
    async with connection(client) as other:
        call = unary(other, "Unary")(b"other", metadata=md(fn))
        assert await call == b"other"
        initial = dict(await call.initial_metadata())
        other_id = text(initial["nvcf-reqid"])
        assert other_id != request_id
        assert initial["set-cookie"] == f"nvcf-request-id={other_id}"
        assert worker.calls[-1].metadata["nvcf-instance-id"] != instance
    await _end(held)


async def test_a_call_joins_its_connections_session_before_the_first_stream_answers(
    client: AppClient, channel: aio.Channel, worker: GrpcWorker
) -> None:
    """A stream the worker has not answered yet (it waits for the caller's first message)
    already is the connection's session: a call beside it is not held until it answers."""
    fn = await deployed(client, **GRPC_FN, specs=TWO)
    stream = bidi(channel, "QuietBidi")(metadata=md(fn))
    while not worker.calls:  # noqa: ASYNC110 (the worker has no event for a call begun)
        await asyncio.sleep(0.01)
    instance = worker.calls[-1].metadata["nvcf-instance-id"]
    call = unary(channel, "Unary")(b"beside", metadata=md(fn), timeout=20)
    assert await call == b"beside"
    assert worker.calls[-1].metadata["nvcf-instance-id"] == instance
    request_id = text(dict(await call.initial_metadata())["nvcf-reqid"])
    await stream.write(b"now")
    assert await stream.read() == b"now"
    assert dict(await stream.initial_metadata())["nvcf-reqid"] == request_id
    await _end(stream)


async def test_the_cookie_resumes_a_session_and_nvcf_reqid_comes_first(
    client: AppClient, channel: aio.Channel, worker: GrpcWorker
) -> None:
    fn = await deployed(client, **GRPC_FN, specs=TWO)
    held = await _held(channel, fn, worker)
    cookie = text(dict(await held.initial_metadata())["set-cookie"])
    request_id = cookie.removeprefix("nvcf-request-id=")
    instance = worker.calls[-1].metadata["nvcf-instance-id"]
    async with connection(client) as other:
        first = unary(other, "Unary")(b"other", metadata=md(fn))
        assert await first == b"other"
        other_id = text(dict(await first.initial_metadata())["nvcf-reqid"])
    assert worker.calls[-1].metadata["nvcf-instance-id"] != instance
    async with connection(client) as again:  # a new connection carrying the cookie
        call = unary(again, "Unary")(b"back", metadata=(*md(fn), ("cookie", f"a=b; {cookie}")))
        assert await call == b"back"
        assert dict(await call.initial_metadata())["nvcf-reqid"] == request_id
        assert worker.calls[-1].metadata["nvcf-instance-id"] == instance
        assert worker.calls[-1].metadata["nvcf-reqid"] == request_id
    async with connection(client) as again:
        both = (*md(fn, nvcf_reqid=other_id), ("cookie", cookie))
        call = unary(again, "Unary")(b"reqid", metadata=both)
        assert await call == b"reqid"
        assert dict(await call.initial_metadata())["nvcf-reqid"] == other_id
        assert worker.calls[-1].metadata["nvcf-instance-id"] != instance
    await _end(held)


async def test_an_unknown_session_is_not_found_and_deletes_the_cookie(
    client: AppClient, channel: aio.Channel
) -> None:
    fn = await deployed(client, **GRPC_FN)
    unknown = str(uuid.uuid4())
    for named in (
        (*md(fn), ("cookie", f"nvcf-request-id={unknown}")),
        md(fn, nvcf_reqid=unknown),
    ):
        with pytest.raises(aio.AioRpcError) as info:
            await unary(channel, "Unary")(b"x", metadata=named)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        assert info.value.details() == f"no existing session found for request {unknown}"
        trailing = dict(info.value.trailing_metadata() or ())
        assert trailing["set-cookie"] == "nvcf-request-id=; Max-Age=0"
    with pytest.raises(aio.AioRpcError) as info:
        await unary(channel, "Unary")(b"x", metadata=(*md(fn), ("cookie", "nvcf-request-id=1")))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'nvcf-request-id' is not a UUID" in (info.value.details() or "")
    assert dict(info.value.trailing_metadata() or ())["set-cookie"] == "nvcf-request-id=; Max-Age=0"


async def test_a_connection_whose_session_ended_starts_a_new_one(
    client_factory: ClientFactory, tmp_path: Path, worker: GrpcWorker
) -> None:
    """As NVCF's proxy asks for a new worker when the connection's is gone: with
    NVCF_GRPC_SESSION_IDLE_SECONDS 0 a session ends with its last call."""
    client = await grpc_app(client_factory, tmp_path, worker.url, grpc_session_idle_seconds=0)
    fn = await deployed(client, **GRPC_FN)
    async with connection(client) as ch:
        ids = []
        for _ in range(2):
            call = unary(ch, "Unary")(b"x", metadata=md(fn))
            assert await call == b"x"
            initial = dict(await call.initial_metadata())
            request_id = text(initial["nvcf-reqid"])
            assert initial["set-cookie"] == f"nvcf-request-id={request_id}"
            ids.append(request_id)
    assert ids[0] != ids[1]


async def test_a_function_tagged_per_call_is_not_pinned_to_the_connection(
    client: AppClient, channel: aio.Channel, worker: GrpcWorker
) -> None:
    fn = await deployed(client, **GRPC_FN, specs=TWO, tags=["grpc-sessions=per-call"])
    held = await _held(channel, fn, worker)
    assert "set-cookie" not in dict(await held.initial_metadata())
    instance = worker.calls[-1].metadata["nvcf-instance-id"]
    call = unary(channel, "Unary")(b"free", metadata=md(fn))
    assert await call == b"free"
    assert "set-cookie" not in dict(await call.initial_metadata())
    assert worker.calls[-1].metadata["nvcf-instance-id"] != instance  # fewest in flight
    await _end(held)


async def test_a_shared_function_is_served_and_an_invocation_token_works(
    client: AppClient, channel: aio.Channel
) -> None:
    fn = await deployed(client, **GRPC_FN)
    resp = await client.post(
        f"/v2/nvcf/authorizations/functions/{fn['id']}",
        json={"authorizedParties": [{"ncaId": "acct-b"}]},
    )
    assert resp.status_code == 200, resp.text
    shared = await new_key(client, [scopes.INVOKE_FUNCTION], account="acct-b")
    assert await unary(channel, "Unary")(b"b", metadata=md(fn, key=shared)) == b"b"
    stranger = await new_key(client, [scopes.INVOKE_FUNCTION], account="acct-c")
    code, _ = await status_of(unary(channel, "Unary")(b"c", metadata=md(fn, key=stranger)))
    assert code == grpc.StatusCode.NOT_FOUND
    resp = await client.post(f"/v2/nvcf/tokens/functions/{fn['id']}", json={"clientId": "t"})
    assert resp.status_code == 200, resp.text
    token = resp.json()["access_token"]
    assert await unary(channel, "Unary")(b"t", metadata=md(fn, key=token)) == b"t"
    other = await deployed(client, **{**GRPC_FN, "name": "other"})
    code, _ = await status_of(unary(channel, "Unary")(b"t", metadata=md(other, key=token)))
    assert code == grpc.StatusCode.PERMISSION_DENIED


async def test_a_grpc_call_to_a_version_scaled_to_zero_is_served_after_the_cold_start(
    client_factory: ClientFactory, tmp_path: Path, worker: GrpcWorker
) -> None:
    client = await grpc_app(
        client_factory,
        tmp_path,
        worker.url,
        autoscale_interval=0.1,
        autoscale_load_report_seconds=0.05,
    )
    fn = await deployed(client, **GRPC_FN, specs=[spec(minInstances=0, maxInstances=1)])
    assert fn["deployment"]["instances"] == []
    async with aio.insecure_channel(f"127.0.0.1:{client.app.state.grpc.port}") as ch:
        assert await unary(ch, "Unary")(b"cold", metadata=md(fn), timeout=60) == b"cold"
    dep = await deployment(client, fn)
    assert any(i["phase"] == "Running" for i in dep["instances"])


async def test_the_simulated_worker_echoes_every_kind_of_call(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    """The embedded default, with no upstream: any method is echoed."""
    client = await grpc_app(client_factory, tmp_path, None)
    fn = await deployed(client, **GRPC_FN)
    instance = fn["deployment"]["instances"][0]["instanceId"]
    async with aio.insecure_channel(f"127.0.0.1:{client.app.state.grpc.port}") as ch:
        any_method: aio.UnaryUnaryMultiCallable[bytes, bytes] = ch.unary_unary(
            "/any.Service/AnyMethod"
        )
        call = any_method(b"\x01raw", metadata=md(fn))
        assert await call == b"\x01raw"
        initial = dict(await call.initial_metadata())
        assert initial["sim-instance-id"] == instance
        assert "nvcf-reqid" in initial
        assert dict(await call.trailing_metadata())["sim-messages"] == "1"
        server_stream: aio.UnaryStreamMultiCallable[bytes, bytes] = ch.unary_stream(
            "/any.Service/Stream"
        )
        assert [m async for m in server_stream(b"s", metadata=md(fn))] == [b"s"]

        async def one() -> AsyncIterator[bytes]:
            yield b"c"

        client_stream: aio.StreamUnaryMultiCallable[bytes, bytes] = ch.stream_unary("/x.Y/Z")
        assert await client_stream(one(), metadata=md(fn)) == b"c"
        stream_stream: aio.StreamStreamMultiCallable[bytes, bytes] = ch.stream_stream("/x.Y/Bidi")
        both = stream_stream(metadata=md(fn))
        for p in (b"1", b"2"):
            await both.write(p)
            assert await both.read() == p
        await both.done_writing()
        assert await both.read() == aio.EOF


async def test_the_listener_serves_tls_with_the_servers_certificate(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    made = ensure_self_signed(tmp_path / "tls", ["localhost", "127.0.0.1"])
    client = await grpc_app(
        client_factory, tmp_path, None, grpc_tls_cert=made.cert, grpc_tls_key=made.key
    )
    fn = await deployed(client, **GRPC_FN)
    trust = grpc.ssl_channel_credentials(root_certificates=made.cert.read_bytes())
    address = f"localhost:{client.app.state.grpc.port}"
    async with aio.secure_channel(address, trust) as ch:
        assert await unary(ch, "Unary")(b"tls", metadata=md(fn)) == b"tls"
    async with aio.insecure_channel(address) as plain:
        code, _ = await status_of(unary(plain, "Unary")(b"x", metadata=md(fn), timeout=5))
        assert code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
