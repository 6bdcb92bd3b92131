"""Datadog's metrics intake (DATADOG): the OpenTelemetry SDK's metrics as a series v2 request
(`POST /api/v2/series` on the site's API host or the telemetry's intake URL, the key in
`DD-API-KEY`), posted through the observability package's guarded session.

Datadog counts are deltas, so the reader is asked for delta temporality: a counter is a
`count` series of what happened since the last export, a histogram its `.count` and `.sum`
counts, a gauge a `gauge`. Attributes are tags (`key:value`); the resource's `service.name`
is the `service` tag.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import requests
from opentelemetry.sdk.metrics import Counter, Histogram, ObservableCounter, UpDownCounter
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    MetricsData,
    Sum,
)
from opentelemetry.sdk.metrics.export import Histogram as HistogramData

from service.observability.posted import PostedMetrics

PATH = "/api/v2/series"
#: series v2's metric types
COUNT, GAUGE = 1, 3
#: Datadog's counts are deltas (the reader reads this from the exporter that wraps this one)
TEMPORALITY: dict[type, AggregationTemporality] = {
    Counter: AggregationTemporality.DELTA,
    ObservableCounter: AggregationTemporality.DELTA,
    Histogram: AggregationTemporality.DELTA,
    UpDownCounter: AggregationTemporality.CUMULATIVE,
}


def _tags(service: str | None, attributes: Mapping[str, Any] | None) -> list[str]:
    tags = [f"{k}:{v}" for k, v in (attributes or {}).items()]
    if service is not None:
        tags.append(f"service:{service}")
    return tags


def series(data: MetricsData) -> Iterator[dict[str, Any]]:
    """Every series v2 entry the metrics make (one point each)."""
    for rm in data.resource_metrics:
        name = rm.resource.attributes.get("service.name")
        service = str(name) if name is not None else None
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                points = metric.data
                if isinstance(points, HistogramData):
                    for hp in points.data_points:
                        tags, at = _tags(service, hp.attributes), hp.time_unix_nano // 10**9
                        for suffix, value in (("count", float(hp.count)), ("sum", hp.sum)):
                            yield {
                                "metric": f"{metric.name}.{suffix}",
                                "type": COUNT,
                                "points": [{"timestamp": at, "value": value}],
                                "tags": tags,
                            }
                    continue
                kind = COUNT if isinstance(points, Sum) and points.is_monotonic else GAUGE
                for point in points.data_points:
                    yield {
                        "metric": metric.name,
                        "type": kind,
                        "unit": metric.unit or None,
                        "points": [
                            {
                                "timestamp": point.time_unix_nano // 10**9,
                                "value": float(point.value),  # type: ignore[union-attr]
                            }
                        ],
                        "tags": _tags(service, point.attributes),
                    }


def encode(data: MetricsData) -> bytes:
    entries = [{k: v for k, v in e.items() if v is not None} for e in series(data)]
    return json.dumps({"series": entries}, separators=(",", ":")).encode()


class DatadogMetricsExporter(PostedMetrics):
    """Posts each export of the SDK's periodic reader as one series v2 request."""

    def __init__(
        self,
        base_url: str,
        key: str,
        timeout: float,
        max_bytes: int,
        session: requests.Session,
    ) -> None:
        headers = {"DD-API-KEY": key, "Content-Type": "application/json"}
        url = base_url.rstrip("/") + PATH
        super().__init__(url, headers, encode, timeout, max_bytes, session, TEMPORALITY)
