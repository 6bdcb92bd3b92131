"""An account's usage over a period, grouped: GPU-seconds from the intervals (each clipped to
the period; an interval still open counts up to now), the seconds of instances that never
became ready apart, and the invocation and token counts of the hours in the period."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from sqlalchemy.ext.asyncio import AsyncSession

from service.metering import repository
from service.metering.models import GpuInterval, UsageCount


class Grouping(StrEnum):
    FUNCTION = "function"
    VERSION = "version"
    MODEL = "model"
    INSTANCE_TYPE = "instanceType"
    CLUSTER = "cluster"


#: the fields naming a group, by grouping (a task has no version: its id stands alone)
GROUP_FIELDS: dict[Grouping, tuple[str, ...]] = {
    Grouping.FUNCTION: ("functionId", "taskId"),
    Grouping.VERSION: ("functionId", "versionId", "taskId"),
    Grouping.MODEL: ("model",),
    Grouping.INSTANCE_TYPE: ("instanceType",),
    Grouping.CLUSTER: ("cluster",),
}
MEASURES = ("gpuSeconds", "notReadyGpuSeconds", "invocations", "inputTokens", "outputTokens")


@dataclass(frozen=True)
class Span:
    """One instance's (or task's) time on a GPU, from its interval or a task still on a
    cluster."""

    account_id: str
    function_id: str | None
    version_id: str | None
    task_id: str | None
    instance_type: str
    cluster: str | None
    gpus: int
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None

    @classmethod
    def of(cls, row: GpuInterval) -> Span:
        return cls(
            account_id=row.account_id,
            function_id=None if row.function_id is None else str(row.function_id),
            version_id=None if row.version_id is None else str(row.version_id),
            task_id=None if row.task_id is None else str(row.task_id),
            instance_type=row.instance_type,
            cluster=row.cluster,
            gpus=row.gpus,
            created_at=row.created_at,
            started_at=row.started_at,
            ended_at=row.ended_at,
        )


@dataclass
class Group:
    names: dict[str, str | None]
    gpu_seconds: float = 0.0
    not_ready_gpu_seconds: float = 0.0
    invocations: int = 0
    input_tokens: int = 0
    output_tokens: int = 0

    def out(self) -> dict[str, object]:
        return {
            **self.names,
            "gpuSeconds": round(self.gpu_seconds, 3),
            "notReadyGpuSeconds": round(self.not_ready_gpu_seconds, 3),
            "invocations": self.invocations,
            "inputTokens": self.input_tokens,
            "outputTokens": self.output_tokens,
        }


def overlap(start: datetime, end: datetime, since: datetime, until: datetime) -> float:
    """Seconds of [start, end) inside [since, until)."""
    seconds = (min(end, until) - max(start, since)).total_seconds()
    return max(0.0, seconds)


def _span_names(span: Span, by: Grouping) -> dict[str, str | None]:
    values: dict[str, str | None] = {
        "functionId": span.function_id,
        "versionId": span.version_id,
        "taskId": span.task_id,
        "model": None,
        "instanceType": span.instance_type,
        "cluster": span.cluster,
    }
    return {name: values[name] for name in GROUP_FIELDS[by]}


def _count_names(row: UsageCount, by: Grouping) -> dict[str, str | None]:
    values: dict[str, str | None] = {
        "functionId": row.function_id,
        "versionId": row.version_id,
        "taskId": None,
        "model": row.model or None,
        "instanceType": None,
        "cluster": None,
    }
    return {name: values[name] for name in GROUP_FIELDS[by]}


def grouped(
    spans: Iterable[Span],
    counts: Iterable[UsageCount],
    *,
    by: Grouping,
    since: datetime,
    until: datetime,
    now: datetime,
) -> list[Group]:
    """The usage in [since, until) by `by`, in a stable order."""
    groups: dict[tuple[str | None, ...], Group] = {}

    def group(names: dict[str, str | None]) -> Group:
        key = tuple(names.values())
        found = groups.get(key)
        if found is None:
            found = groups[key] = Group(names)
        return found

    end_of_period = min(until, now)
    for span in spans:
        end = span.ended_at or now
        target = group(_span_names(span, by))
        if span.started_at is None:
            seconds = overlap(span.created_at, end, since, end_of_period)
            target.not_ready_gpu_seconds += seconds * span.gpus
        else:
            target.gpu_seconds += overlap(span.started_at, end, since, end_of_period) * span.gpus
    for row in counts:
        target = group(_count_names(row, by))
        target.invocations += row.invocations
        target.input_tokens += row.input_tokens
        target.output_tokens += row.output_tokens
    return sorted(groups.values(), key=lambda g: tuple(str(v or "") for v in g.names.values()))


def totals(groups: Sequence[Group]) -> dict[str, object]:
    total = Group({})
    for g in groups:
        total.gpu_seconds += g.gpu_seconds
        total.not_ready_gpu_seconds += g.not_ready_gpu_seconds
        total.invocations += g.invocations
        total.input_tokens += g.input_tokens
        total.output_tokens += g.output_tokens
    return total.out()


async def account_usage(
    session: AsyncSession,
    account_id: str,
    *,
    by: Grouping,
    since: datetime,
    until: datetime,
    now: datetime,
    open_spans: Sequence[Span] = (),
) -> list[Group]:
    """The account's usage: its stored intervals, `open_spans` (tasks still on a cluster,
    whose interval is written when they end) and its counts."""
    spans, counts = await account_records(session, account_id, since, until, open_spans)
    return grouped(spans, counts, by=by, since=since, until=until, now=now)


async def account_records(
    session: AsyncSession,
    account_id: str,
    since: datetime,
    until: datetime,
    open_spans: Sequence[Span] = (),
) -> tuple[list[Span], list[UsageCount]]:
    """The account's spans and counts that touch [since, until)."""
    rows = await repository.intervals(session, account_id, since, until)
    spans = [*(Span.of(r) for r in rows), *(s for s in open_spans if s.account_id == account_id)]
    counts = await repository.counts(session, account_id, floor_hour(since), until)
    return spans, list(counts)


def floor_hour(at: datetime) -> datetime:
    """The counts are kept per hour: the hour `at` falls in."""
    return at.replace(minute=0, second=0, microsecond=0)


class Step(StrEnum):
    HOUR = "hour"
    DAY = "day"


STEP_LENGTH = {Step.HOUR: timedelta(hours=1), Step.DAY: timedelta(days=1)}
#: the most points one series has
MAX_POINTS = 1000


def windows(since: datetime, until: datetime, step: Step) -> list[tuple[datetime, datetime]]:
    """[since, until) cut at each whole hour (or UTC day) into consecutive windows."""
    length = STEP_LENGTH[step]
    first = floor_hour(since)
    if step is Step.DAY:
        first = first.replace(hour=0)
    out: list[tuple[datetime, datetime]] = []
    start = since
    edge = first + length
    while start < until:
        end = min(edge, until)
        out.append((start, end))
        start, edge = end, edge + length
    return out


def series(
    spans: Sequence[Span],
    counts: Sequence[UsageCount],
    *,
    since: datetime,
    until: datetime,
    now: datetime,
    step: Step,
) -> list[dict[str, object]]:
    """The account's totals per window of `step` (counts by the hour they were kept in)."""
    points: list[dict[str, object]] = []
    for start, end in windows(since, until, step):
        inside = [c for c in counts if floor_hour(start) <= c.hour < end]
        groups = grouped(spans, inside, by=Grouping.FUNCTION, since=start, until=end, now=now)
        points.append({"since": start, "until": end, **totals(groups)})
    return points
