"""A telemetry's pipeline on its own: spans its batch processor has no room for (an endpoint
that does not answer) are dropped and counted, not lost silently."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from prometheus_client import CollectorRegistry

from service.observability.endpoints import Drops
from service.observability.events import Invocation, TraceIds
from service.observability.models import Kind, Telemetry
from service.observability.pipeline import SPAN_QUEUE, ExportSettings, build_pipeline
from tests.support.otlp import OtlpReceiver


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver().start()
    yield r
    r.stop()


def test_spans_beyond_the_processors_queue_are_dropped_and_counted(
    receiver: OtlpReceiver,
) -> None:
    now = datetime.now(UTC)
    row = Telemetry(
        id=uuid.uuid4(),
        account_id="acct",
        name="t",
        endpoint=receiver.url,
        protocol="HTTP",
        provider="OTEL_COLLECTOR",
        types=["TRACES"],
        secret_ciphertext="",
        created_at=now,
        updated_at=now,
    )
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
