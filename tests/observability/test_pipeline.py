"""A telemetry's pipeline on its own: spans its batch processor has no room for (an endpoint
that does not answer) are dropped and counted, not lost silently; an endpoint whose export
failed is left alone until its backoff ends, what it would have got counted as dropped."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from service.observability.endpoints import FIRST_BACKOFF, Drops
from service.observability.events import Invocation, TraceIds
from service.observability.models import Kind
from service.observability.pipeline import SPAN_QUEUE, ExportSettings, Pipeline, build_pipeline
from tests.support.otlp import OtlpReceiver
from tests.support.remote_write import RemoteWriteReceiver
from tests.support.telemetries import telemetry_row


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver().start()
    yield r
    r.stop()


def invoked(pipeline: Pipeline, n: int) -> None:
    """`n` answered invocations recorded for the pipeline's traces and metrics."""
    named = {"tracesTelemetryId": str(pipeline.telemetry_id)}
    for _ in range(n):
        invocation = Invocation(
            "acct",
            "f",
            "v",
            named,
            True,
            1_000,
            4_000,
            queued_ns=2_000,
            dispatched_ns=3_000,
            trace=TraceIds.new(),
        )
        pipeline.record({Kind.TRACES, Kind.METRICS}, invocation)


def test_a_failing_endpoint_is_left_alone_until_its_backoff_ends(receiver: OtlpReceiver) -> None:
    now = [1_000.0]
    registry = CollectorRegistry()
    settings = ExportSettings(
        interval=60, timeout=5, allowlist=(receiver.hostport,), clock=lambda: now[0]
    )
    pipeline = build_pipeline(
        telemetry_row(receiver.url, ["TRACES", "METRICS"]), "k", settings, Drops(registry)
    )

    def dropped(reason: str) -> float:
        value = registry.get_sample_value("nvcf_telemetry_dropped_total", {"reason": reason})
        return value or 0.0

    try:
        receiver.status = 401
        invoked(pipeline, 1)
        pipeline.flush(5000)
        assert receiver.requests == 1  # the spans, refused: the metrics are not sent after it
        assert dropped("export_failed") == 4 and dropped("endpoint_failing") == 1
        taken = pipeline.status.take()
        assert taken is not None and "HTTP 401" in str(taken[2])

        # in backoff: nothing is built or sent, every signal is counted as dropped
        invoked(pipeline, 10)
        pipeline.flush(5000)
        assert receiver.requests == 1
        assert dropped("endpoint_failing") == 1 + 10 * (4 + 1) + 1  # spans, points, export
        taken = pipeline.status.take()
        assert taken is not None and "HTTP 401" in str(taken[2]) and taken[3] == 10 * 5 + 1

        # the backoff over, the next export is its retry; it succeeds and ends the backoff
        now[0] += FIRST_BACKOFF
        receiver.status = 200
        invoked(pipeline, 2)
        pipeline.flush(5000)
        assert len(list(receiver.spans())) == 8
        assert not pipeline.status.failing()
        taken = pipeline.status.take()
        assert taken is not None and taken[0] is not None and taken[1] is not None
        assert taken[0] > taken[1]
    finally:
        pipeline.shutdown()


def test_spans_beyond_the_processors_queue_are_dropped_and_counted(
    receiver: OtlpReceiver,
) -> None:
    row = telemetry_row(receiver.url, ["TRACES"])
    registry = CollectorRegistry()
    # the endpoint holds every request: the first batch stays in flight, the queue fills
    settings = ExportSettings(interval=60, timeout=30, allowlist=(receiver.hostport,))
    pipeline = build_pipeline(row, "k", settings, Drops(registry))
    receiver.hold()
    invocations = SPAN_QUEUE // 4 + 100  # four spans each: 400 spans more than fit
    try:
        for _ in range(invocations):
            pipeline.record(
                {Kind.TRACES},
                Invocation(
                    "acct",
                    "f",
                    "v",
                    {"tracesTelemetryId": str(row.id)},
                    True,
                    1_000,
                    4_000,
                    queued_ns=2_000,
                    dispatched_ns=3_000,
                    trace=TraceIds.new(),
                ),
            )
        dropped = registry.get_sample_value(
            "nvcf_telemetry_dropped_total", {"reason": "queue_full"}
        )
        assert dropped == invocations * 4 - SPAN_QUEUE
    finally:
        receiver.release()
        pipeline.shutdown()


def test_each_replica_sends_what_it_counted_under_its_own_label() -> None:
    """Two replicas serve one function: each sends its own cumulative total. Under one label
    set they would read as a single counter jumping between 3 and 5 (a reset each time); with
    `nvcf_replica` they are two series whose sum is the function's total."""
    receiver = RemoteWriteReceiver().start()
    row = telemetry_row(receiver.url, ["METRICS"], provider="PROMETHEUS")
    pipelines = {
        replica: build_pipeline(
            row,
            "k",
            ExportSettings(interval=60, timeout=5, allowlist=(receiver.hostport,), replica=replica),
            Drops(CollectorRegistry()),
        )
        for replica in ("replica-a", "replica-b")
    }
    try:
        invoked(pipelines["replica-a"], 3)
        invoked(pipelines["replica-b"], 5)
        for pipeline in pipelines.values():
            pipeline.flush(5000)
        last = {
            s.labels["nvcf_replica"]: s.value
            for s in receiver.samples("nvcf_function_invocations_total", nvcf_function_id="f")
        }
        assert last == {"replica-a": 3, "replica-b": 5}
    finally:
        for pipeline in pipelines.values():
            pipeline.shutdown()
        receiver.stop()
