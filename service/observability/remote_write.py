"""Prometheus remote write (PROMETHEUS, VICTORIAMETRICS, KRATOS_THANOS): the OpenTelemetry SDK's
metrics as a remote-write 1.0 `WriteRequest` (protobuf, raw snappy), posted through the
observability package's guarded session.

Names and labels follow OpenTelemetry's Prometheus compatibility rules: characters outside
`[a-zA-Z0-9_:]` become `_`, a unit in seconds adds `_seconds`, a monotonic sum `_total`, a
histogram is its `_bucket{le}` series (cumulative), `_sum` and `_count`, and the resource's
`service.name` is the `job` label. Points are cumulative: a receiver keeps the total.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from typing import Any

import cramjam
import requests
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message
from opentelemetry.sdk.metrics.export import (
    Histogram,
    MetricsData,
    Sum,
)

from service.observability.posted import PostedMetrics

#: remote write 1.0's headers (its specification)
HEADERS = {
    "Content-Type": "application/x-protobuf",
    "Content-Encoding": "snappy",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}
_INVALID = re.compile(r"[^a-zA-Z0-9_:]")


def _schema() -> type[Message]:
    """prometheus/prompb's WriteRequest, TimeSeries, Label and Sample (remote.proto,
    types.proto: the field numbers are theirs), the parts remote write 1.0 requires."""
    proto = descriptor_pb2.FileDescriptorProto(
        name="nvcf/prompb_remote_write.proto", package="prometheus", syntax="proto3"
    )
    string, double, int64 = (
        descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
        descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE,
        descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
    )
    message = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
    optional = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
    repeated = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
    shapes: dict[str, list[tuple[str, int, int, int, str]]] = {
        "Label": [("name", 1, string, optional, ""), ("value", 2, string, optional, "")],
        "Sample": [("value", 1, double, optional, ""), ("timestamp", 2, int64, optional, "")],
        "TimeSeries": [
            ("labels", 1, message, repeated, ".prometheus.Label"),
            ("samples", 2, message, repeated, ".prometheus.Sample"),
        ],
        "WriteRequest": [("timeseries", 1, message, repeated, ".prometheus.TimeSeries")],
    }
    for name, fields in shapes.items():
        described = proto.message_type.add(name=name)
        for field, number, kind, label, type_name in fields:
            added = described.field.add(name=field, number=number, type=kind, label=label)
            if type_name:
                added.type_name = type_name
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    found: type[Message] = message_factory.GetMessageClass(
        pool.FindMessageTypeByName("prometheus.WriteRequest")
    )
    return found


WriteRequest = _schema()


def metric_name(name: str, unit: str | None, monotonic_sum: bool) -> str:
    out = _INVALID.sub("_", name)
    if unit == "s" and not out.endswith("_seconds"):
        out += "_seconds"
    if monotonic_sum and not out.endswith("_total"):
        out += "_total"
    return out


def _labels(name: str, job: str | None, attributes: Mapping[str, Any] | None) -> dict[str, str]:
    labels = {_INVALID.sub("_", k): str(v) for k, v in (attributes or {}).items()}
    if job is not None:
        labels["job"] = job
    labels["__name__"] = name
    return labels


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))


def series(data: MetricsData) -> Iterator[tuple[dict[str, str], float, int]]:
    """(labels, value, timestamp in ms) of every sample the metrics make."""
    for rm in data.resource_metrics:
        job = rm.resource.attributes.get("service.name")
        job_label = str(job) if job is not None else None
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                points = metric.data
                if isinstance(points, Histogram):
                    base = metric_name(metric.name, metric.unit, False)
                    for hp in points.data_points:
                        ms = hp.time_unix_nano // 1_000_000
                        cumulative = 0
                        bounds = [*hp.explicit_bounds, math.inf]
                        for bound, count in zip(bounds, hp.bucket_counts, strict=True):
                            cumulative += count
                            labels = _labels(f"{base}_bucket", job_label, hp.attributes)
                            yield {**labels, "le": _le(bound)}, float(cumulative), ms
                        yield _labels(f"{base}_sum", job_label, hp.attributes), hp.sum, ms
                        count_labels = _labels(f"{base}_count", job_label, hp.attributes)
                        yield count_labels, float(hp.count), ms
                    continue
                monotonic = isinstance(points, Sum) and points.is_monotonic
                name = metric_name(metric.name, metric.unit, monotonic)
                for point in points.data_points:
                    value = float(point.value)  # type: ignore[union-attr]
                    ms = point.time_unix_nano // 1_000_000
                    yield _labels(name, job_label, point.attributes), value, ms


def encode(data: MetricsData) -> bytes:
    """The metrics as a WriteRequest, snappy-compressed (raw, as remote write requires)."""
    request: Any = WriteRequest()
    for labels, value, ms in series(data):
        ts = request.timeseries.add()
        for name in sorted(labels):  # remote write requires labels sorted by name
            ts.labels.add(name=name, value=labels[name])
        ts.samples.add(value=value, timestamp=ms)
    return bytes(cramjam.snappy.compress_raw(request.SerializeToString()))


class RemoteWriteExporter(PostedMetrics):
    """Posts each export of the SDK's periodic reader as one remote-write request."""

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str],
        timeout: float,
        max_bytes: int,
        session: requests.Session,
    ) -> None:
        super().__init__(url, {**headers, **HEADERS}, encode, timeout, max_bytes, session)
