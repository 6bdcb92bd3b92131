"""The in-process export of a function's invocations to its telemetries, against real OTLP/HTTP
receivers decoding with the OpenTelemetry protos: counts exact, labels exact, nothing of one
account at another's endpoint, a refusing or hanging endpoint seen in the telemetry's status
and in the operator's drop count while invocations go on, the network guard at each
connection."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from grpc import aio
from openai.types.chat import ChatCompletionMessageParam

from service.core.server import ConnectionLimits
from service.observability import export
from service.observability.endpoints import Drops, EndpointGuard, EndpointStatus
from service.observability.events import Invocation
from service.observability.models import Kind
from service.observability.pipeline import ExportSettings, Pipeline, build_pipeline
from tests.support.api import bearer, new_key
from tests.support.app import ADMIN_KEY, AppClient, ClientFactory
from tests.support.invocation import deployed, invocation_app, pexec_url, sample
from tests.support.otlp import OtlpReceiver, attributes
from tests.support.server import in_loop_server
from tests.support.telemetries import create_telemetry, replica_of, telemetry_row

ACCOUNT = "nvcf-default"
OTHER = "team-b"
INVOCATIONS = "nvcf.function.invocations"
DURATION = "nvcf.function.invocation.duration"
LLM_SUFFIX = "invocation.localhost"
LLM_FN: dict[str, Any] = {
    "name": "tiny-llm",
    "inferenceUrl": "/",
    "functionType": "LLM",
    "models": [{"name": "m", "llmConfig": {"uris": ["/v1/chat/completions"]}}],
}


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver().start()
    yield r
    r.stop()


@pytest.fixture
def other_receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver().start()
    yield r
    r.stop()


async def app(
    client_factory: ClientFactory, tmp_path: Path, *receivers: OtlpReceiver, **overrides: Any
) -> AppClient:
    return await invocation_app(
        client_factory,
        tmp_path,
        telemetry_allowlist=",".join(f"{r.hostport},{r.grpc_hostport}" for r in receivers),
        telemetry_export_interval=0.2,
        # a healthy receiver on a loaded machine may take a second; a hanging one is given less
        **{"telemetry_export_timeout": 5.0, **overrides},
    )


async def exported_function(
    client: AppClient,
    receiver: OtlpReceiver,
    headers: dict[str, str] | None = None,
    protocol: str = "HTTP",
    **fn: Any,
) -> tuple[dict[str, Any], dict[str, Any]]:
    telemetry = await create_telemetry(
        client,
        headers=headers,
        endpoint=receiver.url if protocol == "HTTP" else receiver.grpc_url,
        protocol=protocol,
        types=["METRICS", "TRACES"],
    )
    tid = telemetry["telemetryId"]
    mine = dict(client.headers)
    client.headers.update(headers or {})  # deployed() acts as the client's account
    try:
        created = await deployed(
            client, telemetries={"metricsTelemetryId": tid, "tracesTelemetryId": tid}, **fn
        )
    finally:
        client.headers.clear()
        client.headers.update(mine)
    return telemetry, created


async def invoke(
    client: AppClient, fn: dict[str, Any], n: int, headers: dict[str, str] | None = None
) -> None:
    for _ in range(n):
        resp = await client.post(pexec_url(fn), json={"x": 1}, headers=headers)
        assert resp.status_code == 200, resp.text


async def flush(client: AppClient) -> None:
    exports = client.app.state.telemetry_exports
    assert exports is not None
    await exports.flush()


def not_sent(metrics: str) -> float:
    """The signals dropped unsent: those of the export that failed (at least one), and those
    dropped unbuilt while the endpoint was in backoff after it."""
    failed = sample(metrics, "nvcf_telemetry_dropped_total", reason="export_failed")
    assert failed >= 1
    return failed + sample(metrics, "nvcf_telemetry_dropped_total", reason="endpoint_failing")


def roots(receiver: OtlpReceiver) -> list[tuple[dict[str, Any], Any]]:
    """(resource attributes, span) of each invocation's own span: one trace each."""
    return [(r, s) for r, s in receiver.spans() if s.name == "invocation"]


def last_point(receiver: OtlpReceiver, name: str, function_id: str) -> Any:
    points = [
        p
        for _, p in receiver.metric_points(name)
        if attributes(p.attributes).get("nvcf.function.id") == function_id
    ]
    assert points, f"no {name} point of {function_id}"
    return points[-1]  # cumulative: the last export holds the total


async def test_a_hundred_invocations_arrive_as_a_hundred(
    client_factory: ClientFactory, tmp_path: Path, receiver: OtlpReceiver
) -> None:
    client = await app(client_factory, tmp_path, receiver)
    telemetry, fn = await exported_function(client, receiver)
    await invoke(client, fn, 100)
    await flush(client)

    labels = {
        "nvcf.account": ACCOUNT,
        "nvcf.function.id": fn["id"],
        "nvcf.function.version.id": fn["versionId"],
    }
    spans = roots(receiver)
    assert len(spans) == 100 and len({s.trace_id for _, s in spans}) == 100
    assert len(list(receiver.spans())) == 400  # each with admission, queue wait, worker
    for resource, span in spans:
        assert resource["nvcf.account"] == ACCOUNT
        assert attributes(span.attributes) == labels
        assert span.name == "invocation" and span.end_time_unix_nano >= span.start_time_unix_nano
    count = last_point(receiver, INVOCATIONS, fn["id"])
    assert count.as_int == 100
    counted = {**labels, "nvcf.replica": replica_of(client)}  # the series this replica counts
    assert attributes(count.attributes) == {**counted, "outcome": "fulfilled"}
    assert last_point(receiver, DURATION, fn["id"]).count == 100
    assert {r.headers["authorization"] for r in receiver.received} == {"Bearer otlp-key"}

    got = (await client.get(f"/v2/nvcf/telemetries/{telemetry['telemetryId']}")).json()
    status = got["telemetry"]["status"]
    assert "lastSuccessAt" in status and "lastError" not in status


def worker_traceparent(spans: list[Any], traceparent: str) -> Any:
    """The exported span the worker's `traceparent` names as its parent (same trace)."""
    _, trace_id, span_id, flags = traceparent.split("-")
    assert flags == "01"  # sampled: the worker's spans are recorded
    named = [s for s in spans if s.span_id.hex() == span_id]
    assert len(named) == 1, traceparent
    assert named[0].trace_id.hex() == trace_id
    return named[0]


def phases_of(spans: list[Any]) -> dict[str, Any]:
    """The invocation span's children by name, each checked to be its child in its trace."""
    (root,) = [s for s in spans if s.name == "invocation"]
    children = {s.name: s for s in spans if s is not root}
    for child in children.values():
        assert child.trace_id == root.trace_id and child.parent_span_id == root.span_id
        assert root.start_time_unix_nano <= child.start_time_unix_nano
        assert child.end_time_unix_nano <= root.end_time_unix_nano
    return children


async def test_the_invocation_span_has_its_phases_and_the_workers_spans_join_it(
    client_factory: ClientFactory, tmp_path: Path, receiver: OtlpReceiver
) -> None:
    client = await app(client_factory, tmp_path, receiver)
    _, fn = await exported_function(client, receiver)
    caller = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"  # the caller's is not the worker's
    resp = await client.post(pexec_url(fn), json={"x": 1}, headers={"traceparent": caller})
    assert resp.status_code == 200, resp.text
    traceparent = resp.json()["headers"]["traceparent"]
    await flush(client)

    spans = [span for _, span in receiver.spans()]
    children = phases_of(spans)
    assert sorted(children) == ["admission", "queue wait", "worker"]
    assert worker_traceparent(spans, traceparent) is children["worker"]
    admission, waited, worker = (children[n] for n in ("admission", "queue wait", "worker"))
    assert admission.end_time_unix_nano == waited.start_time_unix_nano
    assert waited.end_time_unix_nano == worker.start_time_unix_nano
    assert traceparent != caller


async def test_a_grpc_worker_gets_the_worker_spans_traceparent(
    client_factory: ClientFactory, tmp_path: Path, receiver: OtlpReceiver
) -> None:
    client = await app(client_factory, tmp_path, receiver, grpc_enabled=True, grpc_port=0)
    _, fn = await exported_function(
        client, receiver, name="grpc-echo", inferenceUrl="/gRPC", inferencePort=8001
    )
    metadata = (("authorization", f"Bearer {ADMIN_KEY}"), ("function-id", fn["id"]))
    async with aio.insecure_channel(f"127.0.0.1:{client.app.state.grpc.port}") as channel:
        stub: aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
            "/any.Service/AnyMethod"
        )
        call = stub(b"x", metadata=metadata)
        assert await call == b"x"
        traceparent = dict(await call.initial_metadata())["sim-traceparent"]
    await flush(client)

    spans = [span for _, span in receiver.spans()]
    assert worker_traceparent(spans, str(traceparent)) is phases_of(spans)["worker"]


async def test_a_version_naming_no_traces_telemetry_sends_no_traceparent(
    client_factory: ClientFactory, tmp_path: Path, receiver: OtlpReceiver
) -> None:
    client = await app(client_factory, tmp_path, receiver)
    telemetry = await create_telemetry(client, endpoint=receiver.url, types=["METRICS"])
    fn = await deployed(client, telemetries={"metricsTelemetryId": telemetry["telemetryId"]})
    resp = await client.post(pexec_url(fn), json={"x": 1})
    assert "traceparent" not in resp.json()["headers"]


async def test_queue_depth_and_in_flight_are_exported(
    client_factory: ClientFactory, tmp_path: Path, receiver: OtlpReceiver
) -> None:
    client = await app(client_factory, tmp_path, receiver)
    _, fn = await exported_function(client, receiver)
    await invoke(client, fn, 2)
    await flush(client)
    labels = {
        "nvcf.account": ACCOUNT,
        "nvcf.function.id": fn["id"],
        "nvcf.function.version.id": fn["versionId"],
    }
    for name in ("nvcf.function.queue_depth", "nvcf.function.in_flight"):
        point = last_point(receiver, name, fn["id"])
        assert attributes(point.attributes) == {**labels, "nvcf.replica": replica_of(client)}
        assert point.as_int == 0  # nothing waits or runs once both were answered


async def test_otlp_over_grpc(
    client_factory: ClientFactory, tmp_path: Path, receiver: OtlpReceiver
) -> None:
    client = await app(client_factory, tmp_path, receiver)
    telemetry, fn = await exported_function(client, receiver, protocol="GRPC")
    await invoke(client, fn, 10)
    await flush(client)
    assert len(roots(receiver)) == 10
    assert last_point(receiver, INVOCATIONS, fn["id"]).as_int == 10
    assert last_point(receiver, DURATION, fn["id"]).count == 10
    assert {r.headers["authorization"] for r in receiver.received} == {"Bearer otlp-key"}

    receiver.status = 401
    await invoke(client, fn, 1)
    await flush(client)
    got = (await client.get(f"/v2/nvcf/telemetries/{telemetry['telemetryId']}")).json()
    assert "gRPC" in got["telemetry"]["status"]["lastError"]


async def test_nothing_of_another_account_is_exported(
    client_factory: ClientFactory,
    tmp_path: Path,
    receiver: OtlpReceiver,
    other_receiver: OtlpReceiver,
) -> None:
    client = await app(client_factory, tmp_path, receiver, other_receiver)
    scopes = [
        "register_function",
        "deploy_function",
        "list_functions",
        "invoke_function",
        "manage_telemetries",
    ]
    theirs = bearer(await new_key(client, scopes, account=OTHER))
    _, mine = await exported_function(client, receiver)
    _, other = await exported_function(client, other_receiver, headers=theirs)
    plain = await deployed(client)  # names no telemetry
    await invoke(client, mine, 3)
    await invoke(client, other, 4, headers=theirs)
    await invoke(client, plain, 5)
    await flush(client)

    def functions(r: OtlpReceiver) -> set[str]:
        return {attributes(s.attributes)["nvcf.function.id"] for _, s in r.spans()}

    assert functions(receiver) == {mine["id"]}
    assert functions(other_receiver) == {other["id"]}
    assert {res["nvcf.account"] for res, _ in other_receiver.spans()} == {OTHER}
    assert last_point(other_receiver, INVOCATIONS, other["id"]).as_int == 4
    assert not list(other_receiver.metric_points(INVOCATIONS)) or all(
        attributes(p.attributes)["nvcf.function.id"] == other["id"]
        for _, p in other_receiver.metric_points(INVOCATIONS)
    )


async def test_a_rate_limited_invocation_is_exported_as_an_error(
    client_factory: ClientFactory, tmp_path: Path, receiver: OtlpReceiver
) -> None:
    client = await app(client_factory, tmp_path, receiver)
    _, fn = await exported_function(client, receiver, rateLimit={"rateLimit": "1-M"})
    await invoke(client, fn, 1)
    refused = await client.post(pexec_url(fn), json={"x": 1})
    assert refused.status_code == 429, refused.text
    await flush(client)

    spans = [span for _, span in roots(receiver)]
    assert len(spans) == 2
    errors = [s for s in spans if s.status.code == s.status.STATUS_CODE_ERROR]
    assert [s.status.message for s in errors] == ["rate_limited"]
    by_outcome = {
        attributes(p.attributes)["outcome"]: p.as_int
        for _, p in receiver.metric_points(INVOCATIONS)
    }
    assert by_outcome == {"fulfilled": 1, "rate_limited": 1}
    assert last_point(receiver, DURATION, fn["id"]).count == 1  # the latency of the answered


async def test_an_llm_functions_tokens_are_exported(
    client_factory: ClientFactory, tmp_path: Path, receiver: OtlpReceiver
) -> None:
    client = await app(client_factory, tmp_path, receiver, invoke_host_suffix=LLM_SUFFIX)
    _, fn = await exported_function(client, receiver, **LLM_FN)
    limits = ConnectionLimits(
        header_timeout=10, body_timeout=10, keepalive_timeout=5, max_connections=10
    )
    async with in_loop_server(client.app, limits) as server:
        base = f"http://127.0.0.1:{server.config.port}/v2/nvcf/llm/v1"
        llm = openai.AsyncOpenAI(base_url=base, api_key=ADMIN_KEY, max_retries=0)
        try:
            ask: list[ChatCompletionMessageParam] = [{"role": "user", "content": "short"}]
            for _ in range(2):
                answer = await llm.chat.completions.create(
                    model=f"{fn['id']}/m", messages=ask, max_tokens=30
                )
        finally:
            await llm.close()
    assert answer.usage is not None
    await flush(client)

    tokens = {
        attributes(p.attributes)["token_type"]: (p.as_int, attributes(p.attributes))
        for _, p in receiver.metric_points("nvcf.function.tokens")
    }
    assert tokens["input"][0] == 2 * answer.usage.prompt_tokens
    assert tokens["output"][0] == 2 * answer.usage.completion_tokens
    assert tokens["output"][1] == {
        "nvcf.account": ACCOUNT,
        "nvcf.function.id": fn["id"],
        "nvcf.function.version.id": fn["versionId"],
        "nvcf.replica": replica_of(client),
        "model": "m",
        "token_type": "output",
    }


async def test_a_refusing_endpoint_shows_why_and_counts_the_drops(
    client_factory: ClientFactory, tmp_path: Path, receiver: OtlpReceiver
) -> None:
    client = await app(client_factory, tmp_path, receiver)
    telemetry, fn = await exported_function(client, receiver)
    receiver.status = 401
    await invoke(client, fn, 10)
    await flush(client)
    got = (await client.get(f"/v2/nvcf/telemetries/{telemetry['telemetryId']}")).json()
    status = got["telemetry"]["status"]
    assert "HTTP 401" in status["lastError"] and "lastErrorAt" in status
    assert status["dropped"] >= 10  # the telemetry's own count: each span of the failed batches
    metrics = (await client.get("/metrics")).text
    assert not_sent(metrics) >= 10


async def test_a_hanging_endpoint_does_not_hold_invocations(
    client_factory: ClientFactory, tmp_path: Path, receiver: OtlpReceiver
) -> None:
    client = await app(client_factory, tmp_path, receiver, telemetry_export_timeout=1.0)
    telemetry, fn = await exported_function(client, receiver)
    receiver.hold()
    await invoke(client, fn, 20)  # each answered while exports wait on the endpoint
    await flush(client)
    receiver.release()
    got = (await client.get(f"/v2/nvcf/telemetries/{telemetry['telemetryId']}")).json()
    assert "no answer" in got["telemetry"]["status"]["lastError"]
    metrics = (await client.get("/metrics")).text
    assert not_sent(metrics) >= 20


async def test_an_endpoint_that_is_down_shows_why_and_counts_the_drops(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    down = OtlpReceiver().start()
    down.stop()  # its port: nobody listens there now
    client = await app(client_factory, tmp_path, down, telemetry_export_timeout=1.0)
    telemetry = await create_telemetry(client, endpoint=down.url, types=["METRICS", "TRACES"])
    tid = telemetry["telemetryId"]
    fn = await deployed(client, telemetries={"metricsTelemetryId": tid, "tracesTelemetryId": tid})
    await invoke(client, fn, 5)  # each answered although nothing takes the exports
    await flush(client)
    got = (await client.get(f"/v2/nvcf/telemetries/{tid}")).json()
    assert "no answer" in got["telemetry"]["status"]["lastError"]
    metrics = (await client.get("/metrics")).text
    assert not_sent(metrics) >= 5


async def test_a_full_queue_drops_and_counts(
    client_factory: ClientFactory, tmp_path: Path, receiver: OtlpReceiver
) -> None:
    client = await app(client_factory, tmp_path, receiver, telemetry_queue_size=1)
    _, fn = await exported_function(client, receiver)
    await asyncio.gather(*(invoke(client, fn, 1) for _ in range(20)))
    await flush(client)
    metrics = (await client.get("/metrics")).text
    exported = last_point(receiver, INVOCATIONS, fn["id"]).as_int
    dropped = sample(metrics, "nvcf_telemetry_dropped_total", reason="queue_full")
    assert exported + dropped == 20 and exported >= 1


def test_each_connection_is_guarded(receiver: OtlpReceiver) -> None:
    """A telemetry whose host now resolves to a loopback address (it was allowed, or its name
    changed) is refused at the connection, and the status says why."""
    status = EndpointStatus()
    with pytest.raises(OSError, match="loopback"):
        EndpointGuard((), status).pinned("127.0.0.1", 4318)
    assert EndpointGuard(("127.0.0.1:4318",), status).pinned("127.0.0.1", 4318) == ["127.0.0.1"]

    row = telemetry_row(receiver.url, ["TRACES"], account=ACCOUNT)
    pipeline = build_pipeline(row, "k", ExportSettings(interval=60, timeout=1), Drops(None))
    pipeline.record(
        {Kind.TRACES},
        Invocation(ACCOUNT, "f", "v", {"tracesTelemetryId": str(row.id)}, True, 1, 2),
    )
    pipeline.flush(5000)
    pipeline.shutdown()
    assert receiver.received == []
    taken = pipeline.status.take()
    assert taken is not None and "loopback" in str(taken[2])


def test_a_redirect_is_not_followed(receiver: OtlpReceiver, other_receiver: OtlpReceiver) -> None:
    receiver.redirect_to = other_receiver.url
    row = telemetry_row(receiver.url, ["TRACES"], account=ACCOUNT)
    allowed = (receiver.hostport, other_receiver.hostport)
    settings = ExportSettings(interval=60, timeout=1, allowlist=allowed)
    pipeline = build_pipeline(row, "k", settings, Drops(None))
    pipeline.record(
        {Kind.TRACES},
        Invocation(ACCOUNT, "f", "v", {"tracesTelemetryId": str(row.id)}, True, 1, 2),
    )
    pipeline.flush(5000)
    pipeline.shutdown()
    assert other_receiver.received == []
    taken = pipeline.status.take()
    assert taken is not None and "HTTP 307" in str(taken[2])


async def test_a_replaced_key_is_used_by_the_next_export(
    client_factory: ClientFactory, tmp_path: Path, receiver: OtlpReceiver
) -> None:
    client = await app(client_factory, tmp_path, receiver)
    receiver.key = "otlp-key"  # the key create_telemetry gives
    telemetry, fn = await exported_function(client, receiver)
    exports = client.app.state.telemetry_exports
    assert exports is not None
    assert (await client.post(pexec_url(fn), json={"x": 1})).status_code == 200
    await exports.flush()
    assert [s.name for _, s in receiver.spans()].count("invocation") == 1

    receiver.key = "rotated-key"  # from now on the receiver accepts only the new key
    resp = await client.put(
        f"/v2/nvcf/secrets/telemetries/{telemetry['telemetryId']}",
        json={"secret": {"name": telemetry["name"], "value": "rotated-key"}},
    )
    assert resp.status_code == 204, resp.text
    assert (await client.post(pexec_url(fn), json={"x": 1})).status_code == 200
    await exports.flush()
    assert [s.name for _, s in receiver.spans()].count("invocation") == 2
    traces = receiver.of("/v1/traces")
    assert traces[-1].headers["authorization"] == "Bearer rotated-key"
    # the timeline says so: in process, nothing of the function restarts
    timeline = await client.get(f"/v2/nvcf/deployments/{fn['deployment']['deploymentId']}/events")
    events = timeline.json()["events"]
    [said] = [e["message"] for e in events if e.get("reason") == "SecretsUpdated"]
    assert "exporter uses the new key" in said and "without a restart" in said
    assert "roll" not in said


async def test_a_pipeline_built_for_a_caller_that_left_is_shut_down_with_the_export(
    client_factory: ClientFactory,
    tmp_path: Path,
    receiver: OtlpReceiver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The export task cancelled at shutdown while a pipeline is built in its thread: the
    pipeline is stored all the same, and stopped with the others, not left exporting."""
    client = await app(client_factory, tmp_path, receiver)
    telemetry = await create_telemetry(client, endpoint=receiver.url, types=["METRICS"])
    exports = client.app.state.telemetry_exports
    assert exports is not None
    building, release, built = threading.Event(), threading.Event(), threading.Event()
    started: list[threading.Thread] = []

    def held_build(*args: Any) -> Pipeline:
        building.set()
        assert release.wait(30)
        before = set(threading.enumerate())
        pipeline = build_pipeline(*args)
        started.extend(t for t in threading.enumerate() if t not in before)
        built.set()
        return pipeline

    monkeypatch.setattr(export, "build_pipeline", held_build)
    load = asyncio.create_task(exports.pipeline(uuid.UUID(telemetry["telemetryId"])))
    assert await asyncio.to_thread(building.wait, 30)
    load.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await load
    assert await asyncio.to_thread(built.wait, 30)
    await exports.stop()
    assert started, "the pipeline started no exporter thread"
    for thread in started:
        thread.join(10)
    assert not [t.name for t in started if t.is_alive()]
