"""The metered totals on /metrics, read from the database when `/metrics` is scraped, at most
once every `max_age` seconds (like the fleet gauges, deployments/metrics.py, and for the same
reasons: the totals are the stored ones, the same on every replica — aggregate replicas with
`max`, not `sum`):

- `nvcf_gpu_seconds_total{account,function_id,task_id,instance_type,cluster}`: GPU-seconds
  from each instance's first Running to its end (an open one up to the refresh);
- `nvcf_gpu_not_ready_seconds_total{...}`: the same for instances that never became ready;
- `nvcf_usage_invocations_total{account,function_id,model}`: invocations that ran;
- `nvcf_usage_tokens_total{account,function_id,model,token_type}`: the workers' tokens.

Every family names tenants' objects: served to operators' scrapes only (telemetry.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.core.db import utcnow
from service.metering import repository
from service.metering.usage import Span, overlap

log = logging.getLogger("nvcf.metering")

GPU_LABELS = ["account", "function_id", "task_id", "instance_type", "cluster"]
COUNT_LABELS = ["account", "function_id", "model"]
#: spans the stored intervals do not hold yet (tasks still on a cluster), every account's
OpenSpans = Callable[[AsyncSession], Awaitable[Sequence[Span]]]


class UsageCounters:
    """The collector of the metered totals (registered on the app's registry)."""

    def __init__(self, registry: CollectorRegistry, *, max_age: float) -> None:
        self.max_age = max_age
        self._gpu: dict[tuple[str, ...], list[float]] = {}
        self._counts: dict[tuple[str, ...], list[int]] = {}
        self._refreshed_at: float | None = None
        self._lock = asyncio.Lock()
        registry.register(self)

    def _fresh(self) -> bool:
        at = self._refreshed_at
        return at is not None and time.monotonic() - at < self.max_age

    async def refresh(
        self, sessionmaker: async_sessionmaker[AsyncSession], open_spans: OpenSpans
    ) -> None:
        """Read the totals again unless the last reading is younger than `max_age`; a failed
        reading keeps the last values (and is logged)."""
        if self._fresh():
            return
        async with self._lock:
            if self._fresh():
                return
            now = utcnow()
            try:
                async with sessionmaker() as session:
                    closed = await repository.closed_gpu_totals(session, now)
                    rows = await repository.open_intervals(session, now)
                    spans = [*(Span.of(r) for r in rows), *await open_spans(session)]
                    counts = await repository.count_totals(session)
            except Exception:
                log.warning("reading the metered totals for /metrics failed", exc_info=True)
                return
            finally:
                self._refreshed_at = time.monotonic()
            self._gpu = _gpu_totals(closed, spans, now)
            self._counts = {(a, f, m): n for a, f, m, n in counts}

    def collect(self) -> Iterable[Metric]:
        ready = CounterMetricFamily(
            "nvcf_gpu_seconds_total",
            "GPU-seconds from each instance's first Running to its end (stored totals).",
            labels=GPU_LABELS,
        )
        not_ready = CounterMetricFamily(
            "nvcf_gpu_not_ready_seconds_total",
            "GPU-seconds of instances that never became ready (stored totals).",
            labels=GPU_LABELS,
        )
        for key, (seconds, waiting) in sorted(self._gpu.items()):
            ready.add_metric(list(key), seconds)
            not_ready.add_metric(list(key), waiting)
        invocations = CounterMetricFamily(
            "nvcf_usage_invocations_total",
            "Invocations that ran, by the caller's account (stored totals).",
            labels=COUNT_LABELS,
        )
        tokens = CounterMetricFamily(
            "nvcf_usage_tokens_total",
            "Tokens the workers reported, by the caller's account and type (stored totals).",
            labels=[*COUNT_LABELS, "token_type"],
        )
        for key, (n, given, taken) in sorted(self._counts.items()):
            invocations.add_metric(list(key), n)
            tokens.add_metric([*key, "input"], given)
            tokens.add_metric([*key, "output"], taken)
        return [ready, not_ready, invocations, tokens]


def _gpu_totals(
    closed: Iterable[tuple[tuple[Any, ...], float, float]], spans: Iterable[Span], now: datetime
) -> dict[tuple[str, ...], list[float]]:
    """The ended intervals' totals (summed by the database) plus the open spans' up to `now`."""
    out: dict[tuple[str, ...], list[float]] = {}
    for (account, fid, tid, instance_type, cluster), ready, waiting in closed:
        key = (account, _text(fid), _text(tid), instance_type, cluster or "")
        entry = out.setdefault(key, [0.0, 0.0])
        entry[0] += ready
        entry[1] += waiting
    for s in spans:
        key = (s.account_id, s.function_id or "", s.task_id or "", s.instance_type, s.cluster or "")
        entry = out.setdefault(key, [0.0, 0.0])
        end = s.ended_at or now
        if s.started_at is None:
            entry[1] += overlap(s.created_at, end, s.created_at, now) * s.gpus
        else:
            entry[0] += overlap(s.started_at, end, s.started_at, now) * s.gpus
    return out


def _text(value: object) -> str:
    return "" if value is None else str(value)
