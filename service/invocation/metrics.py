"""Invocation metrics on /metrics, per function version (labels `function_id`, `version_id`):

- `nvcf_invocation_requests_total{outcome}`: requests by how they ended — `fulfilled` (the
  worker answered < 400), `errored` (the worker answered ≥ 400, or no worker answered),
  `rate_limited`, `queue_full`;
- `nvcf_invocation_duration_seconds`: from acceptance to the end of the worker's answer;
- `nvcf_invocation_in_flight`: requests on an instance now (this process);
- `nvcf_invocation_queue_depth`: requests waiting for an instance.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from service.invocation.routing import Target

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class InvocationMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["function_id", "version_id"]
        self.requests = Counter(
            "nvcf_invocation_requests_total",
            "Invocations by function version and outcome.",
            [*labels, "outcome"],
            registry=registry,
        )
        self.latency = Histogram(
            "nvcf_invocation_duration_seconds",
            "Invocation time from acceptance to the end of the worker's answer.",
            labels,
            registry=registry,
            buckets=BUCKETS,
        )
        self.in_flight = Gauge(
            "nvcf_invocation_in_flight",
            "Invocations on an instance now, by function version.",
            labels,
            registry=registry,
        )
        self.queue_depth = Gauge(
            "nvcf_invocation_queue_depth",
            "Invocations waiting for an instance, by function version.",
            labels,
            registry=registry,
        )
        self._children: dict[tuple[int, str, str, str], Any] = {}
        #: [in flight, waiting] per version, as the dispatcher last told them
        self._loads: dict[uuid.UUID, list[int]] = {}

    def _child(self, metric: Any, function_id: str, version_id: str, extra: str = "") -> Any:
        key = (id(metric), function_id, version_id, extra)
        child = self._children.get(key)
        if child is None:
            values = (function_id, version_id, extra) if extra else (function_id, version_id)
            child = self._children[key] = metric.labels(*values)
        return child

    def outcome(self, function_id: str, version_id: str, outcome: str) -> None:
        self._child(self.requests, function_id, version_id, outcome).inc()

    def observe(self, function_id: str, version_id: str, seconds: float) -> None:
        self._child(self.latency, function_id, version_id).observe(seconds)

    def set_load(self, target: Target, in_flight: int, depth: int) -> None:
        """A dispatcher's `LoadListener` (the metrics keep no reference back to it). Told at
        every change of every request: it keeps the numbers, which the two gauges read when
        /metrics is scraped."""
        key = target.version_id
        load = self._loads.get(key)
        if load is None:
            load = self._loads[key] = [0, 0]
            in_flight_of, depth_of = self._reader(load, 0), self._reader(load, 1)
            self._child(self.in_flight, target.fid, target.vid).set_function(in_flight_of)
            self._child(self.queue_depth, target.fid, target.vid).set_function(depth_of)
        load[0] = in_flight
        load[1] = depth

    @staticmethod
    def _reader(load: list[int], index: int) -> Callable[[], float]:
        return lambda: float(load[index])
