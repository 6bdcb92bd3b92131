"""Invocation metrics on /metrics, per function version (labels `function_id`, `version_id`):

- `nvcf_invocation_requests_total{outcome}`: requests by how they ended — `fulfilled` (the
  worker answered < 400), `errored` (the worker answered ≥ 400, or no worker answered),
  `rate_limited`, `queue_full`;
- `nvcf_invocation_duration_seconds`: from acceptance to the end of the worker's answer;
- `nvcf_invocation_in_flight`: requests on an instance now (this process);
- `nvcf_invocation_queue_depth`: requests waiting for an instance.

The versions under a canary release are also counted for its analysis (figures.py).

An answered or refused request of a version that names telemetries is also handed to the
export to the tenant's endpoints (observability/export.py): its figures only, the exported
event is built when the export drains its buffer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from service.invocation.figures import Measured
from service.invocation.load import VersionLoad
from service.invocation.routing import Target
from service.metering.counts import Meter
from service.observability.events import Invocation, Tokens, TraceIds, Watched
from service.observability.export import Exports

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


@dataclass(frozen=True, slots=True)
class Timeline:
    """A run's moments on the event loop's clock: admission began, it was queued, an
    instance took it (None: none did), it ended; and its trace's ids (None: not traced)."""

    began: float
    queued: float
    dispatched: float | None
    ended: float
    trace: TraceIds | None = None


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
        #: the label children of an answered request, by (version id as text, fulfilled)
        self._children: dict[tuple[str, bool], tuple[Counter, Histogram]] = {}
        #: the export to tenants' telemetry endpoints (observability/export.py), when running
        self.exports: Exports | None = None
        #: the invocation and token counts (metering/counts.py), when running
        self.meter: Meter | None = None
        #: the versions under a canary release, counted for its analysis
        self.measured = Measured(registry)

    def refused(self, target: Target, outcome: str) -> None:
        """A request refused before it reached an instance (`rate_limited`, `queue_full`)."""
        self.requests.labels(target.fid, target.vid, outcome).inc()
        if target.telemetries and self.exports is not None:
            self.exports.later(_exported, target, False, 0.0, None, time.time_ns(), outcome)

    def answered(
        self,
        target: Target,
        fulfilled: bool,
        seconds: float,
        model: str = "",
        timeline: Timeline | None = None,
    ) -> None:
        """A request the worker answered: its outcome and its time (from acceptance),
        metered for the caller's account under `model`; `timeline` places its phases in the
        exported trace."""
        if self.meter is not None:
            self.meter.invocation(target.caller_account, target.fid, target.vid, model)
        key = (target.vid, fulfilled)
        children = self._children.get(key)
        if children is None:
            fid, vid = target.fid, target.vid
            outcome = "fulfilled" if fulfilled else "errored"
            children = (self.requests.labels(fid, vid, outcome), self.latency.labels(fid, vid))
            self._children[key] = children
        children[0].inc()
        children[1].observe(seconds)
        self.measured.add(target.vid, not fulfilled, seconds)
        if target.telemetries and self.exports is not None:
            self.exports.later(_exported, target, fulfilled, seconds, timeline, time.time_ns())

    def tokens(self, target: Target, model: str, input_tokens: int, output_tokens: int) -> None:
        """The tokens an LLM worker reported for a request (llm/gateway.py): metered for the
        caller's account, and for the version's telemetries (on /metrics the gateway counts
        them as `nvcf_llm_tokens_total`)."""
        if self.meter is not None:
            self.meter.tokens(
                target.caller_account, target.fid, target.vid, model, input_tokens, output_tokens
            )
        if target.telemetries and self.exports is not None:
            self.exports.later(
                Tokens,
                target.owner_account,
                target.fid,
                target.vid,
                target.telemetries,
                model,
                input_tokens,
                output_tokens,
            )

    def watch_load(self, target: Target, load: VersionLoad) -> None:
        """The load tracker's `on_version` (load.py): the two gauges read the version's
        record when /metrics is scraped (a later record of the version takes its place)."""
        self.in_flight.labels(target.fid, target.vid).set_function(lambda: float(load.in_flight))
        self.queue_depth.labels(target.fid, target.vid).set_function(lambda: float(load.waiting))
        if target.telemetries and self.exports is not None:
            self.exports.watch(
                Watched(target.owner_account, target.fid, target.vid, target.telemetries, load)
            )


def _exported(
    target: Target,
    fulfilled: bool,
    seconds: float,
    timeline: Timeline | None,
    end: int,
    refusal: str | None = None,
) -> Invocation:
    """The exported invocation of a request, answered or refused (`refusal`, taking no time),
    built when the export's buffer is drained: the request path only hands over its figures."""
    queued = dispatched = None
    start = end - int(seconds * 1e9)
    if timeline is not None:

        def at(moment: float) -> int:
            return end - int((timeline.ended - moment) * 1e9)

        start, queued = at(timeline.began), at(timeline.queued)
        if timeline.dispatched is not None:
            dispatched = at(timeline.dispatched)
    return Invocation(
        account=target.owner_account,
        function_id=target.fid,
        version_id=target.vid,
        telemetries=target.telemetries,
        fulfilled=fulfilled,
        start_ns=start,
        end_ns=end,
        queued_ns=queued,
        dispatched_ns=dispatched,
        trace=timeline.trace if timeline is not None else None,
        refusal=refusal,
    )
