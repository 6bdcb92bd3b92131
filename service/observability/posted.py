"""A metrics exporter that POSTs each export of the SDK's periodic reader as one request, its
body encoded by the wire's own module (remote_write.py, datadog.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import requests
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    MetricExporter,
    MetricExportResult,
    MetricsData,
)


class PostedMetrics(MetricExporter):
    """One POST per export through the endpoint's guarded session: a body over `max_bytes` is
    not sent, redirects are not followed, and any 2xx answer is a success."""

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str],
        encode: Callable[[MetricsData], bytes],
        timeout: float,
        max_bytes: int,
        session: requests.Session,
        temporality: dict[type, AggregationTemporality] | None = None,
    ) -> None:
        super().__init__(preferred_temporality=temporality)
        self._url, self._headers, self._encode = url, dict(headers), encode
        self._timeout, self._max_bytes, self._session = timeout, max_bytes, session

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        body = self._encode(metrics_data)
        if len(body) > self._max_bytes:
            return MetricExportResult.FAILURE
        try:
            response = self._session.post(
                self._url,
                data=body,
                headers=self._headers,
                timeout=min(self._timeout, timeout_millis / 1000),
                allow_redirects=False,
            )
        except (requests.RequestException, OSError):
            return MetricExportResult.FAILURE
        ok = 200 <= response.status_code < 300
        return MetricExportResult.SUCCESS if ok else MetricExportResult.FAILURE

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._session.close()
