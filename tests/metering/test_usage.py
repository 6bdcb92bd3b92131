"""The grouping of spans and counts (metering/usage.py): each span clipped to the period, an
open one up to now, never-ready time apart, each measure in the group of its attributes, and a
series whose points add up to the whole period."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise

from service.metering.models import UsageCount
from service.metering.usage import Grouping, Span, Step, grouped, series, totals, windows

T0 = datetime(2026, 12, 1, 10, 30, tzinfo=UTC)
FN = "f-1"


def span(start: float, end: float | None, *, ready: bool = True, gpus: int = 2) -> Span:
    created = T0 + timedelta(minutes=start)
    return Span(
        account_id="a",
        function_id=FN,
        version_id="v-1",
        task_id=None,
        instance_type="NCP.GPU.H100_2x",
        cluster="c1",
        gpus=gpus,
        created_at=created,
        started_at=created if ready else None,
        ended_at=None if end is None else T0 + timedelta(minutes=end),
    )


def count(hour: datetime, n: int, model: str = "") -> UsageCount:
    return UsageCount(
        replica="r",
        hour=hour,
        account_id="a",
        function_id=FN,
        version_id="v-1",
        model=model,
        invocations=n,
        input_tokens=10 * n,
        output_tokens=20 * n,
        batch=1,
    )


def test_spans_are_clipped_open_ones_count_to_now_and_never_ready_stands_apart() -> None:
    spans = [span(0, 60), span(30, None), span(0, 10, ready=False)]
    now = T0 + timedelta(minutes=90)
    [g] = grouped(spans, [], by=Grouping.FUNCTION, since=T0, until=T0 + timedelta(hours=5), now=now)
    # 60 min and 60 min (open, to now), 2 GPUs each; 10 min never ready apart
    assert g.gpu_seconds == 2 * 3600 * 2
    assert g.not_ready_gpu_seconds == 600 * 2
    [clipped] = grouped(
        spans, [], by=Grouping.FUNCTION, since=T0 + timedelta(minutes=45), until=now, now=now
    )
    assert clipped.gpu_seconds == (15 + 45) * 60 * 2


def test_each_measure_lands_in_the_group_of_its_attributes() -> None:
    hour = T0.replace(minute=0)
    groups = grouped(
        [span(0, 60)],
        [count(hour, 3, "m1"), count(hour, 2, "m2")],
        by=Grouping.MODEL,
        since=T0,
        until=T0 + timedelta(hours=2),
        now=T0 + timedelta(hours=2),
    )
    out = {g.names["model"]: (g.gpu_seconds, g.invocations) for g in groups}
    assert out == {None: (7200.0, 0), "m1": (0.0, 3), "m2": (0.0, 2)}
    assert totals(groups)["invocations"] == 5


def test_a_series_adds_up_to_the_period() -> None:
    since, until = T0, T0 + timedelta(hours=5)
    cut = windows(since, until, Step.HOUR)
    assert cut[0] == (T0, T0.replace(minute=0) + timedelta(hours=1)) and cut[-1][1] == until
    assert all(a[1] == b[0] for a, b in pairwise(cut))
    spans = [span(0, 200), span(60, None)]
    counts = [count(T0.replace(minute=0) + timedelta(hours=h), h + 1) for h in range(5)]
    now = until
    points = series(spans, counts, since=since, until=until, now=now, step=Step.HOUR)
    whole = totals(grouped(spans, counts, by=Grouping.FUNCTION, since=since, until=until, now=now))
    for measure in ("gpuSeconds", "invocations", "outputTokens"):
        assert sum(p[measure] for p in points) == whole[measure]  # type: ignore[misc]
    assert len(series(spans, counts, since=since, until=until, now=now, step=Step.DAY)) == 1
