"""Each replica's load per version (invocation/load.py): averaged in flight between reports,
reported again only while it is not all zeros, a cold wait signalled at once, and the rows an
autoscaler on any replica reads."""

from __future__ import annotations

import uuid
from pathlib import Path

from prometheus_client import CollectorRegistry
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.deployments.models import LoadReporter, ReportedLoad
from service.invocation.load import LoadTracker
from service.invocation.metrics import InvocationMetrics
from service.invocation.routing import Target
from tests.support.app import ClientFactory
from tests.support.e2e import eventually
from tests.support.invocation import deployed, invocation_app, pexec_url, route, spec
from tests.support.invocation import target as support_target

VID = uuid.UUID(int=200)


def target(instances: int) -> Target:
    return support_target(*(route(n + 1) for n in range(instances)))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_in_flight_is_averaged_between_reports_and_quiet_versions_are_not_repeated() -> None:
    clock = Clock()
    tracker = LoadTracker(clock=clock)
    t = target(2)
    tracker(t, 2, 0)
    clock.now = 1.0
    tracker(t, 0, 0)
    clock.now = 2.0
    (first,) = tracker.snapshot()
    assert first.version_id == VID and first.in_flight == 1.0 and first.waiting == 0
    assert first.last_request_at is not None
    clock.now = 3.0
    (zero,) = tracker.snapshot()  # said once more: the last report was not all zeros
    assert zero.in_flight == 0.0
    clock.now = 4.0
    assert tracker.snapshot() == []  # quiet: nothing to say
    tracker(t, 1, 0)
    clock.now = 5.0
    (busy,) = tracker.snapshot()
    assert busy.in_flight == 1.0
    clock.now = 6.0
    (still,) = tracker.snapshot()  # unchanged but busy: reported every time
    assert still.in_flight == 1.0


def test_a_request_waiting_for_a_version_with_no_instance_is_signalled_at_once() -> None:
    woken: list[uuid.UUID] = []
    tracker = LoadTracker(clock=Clock(), on_cold=woken.append)
    tracker(target(1), 1, 1)  # waits behind a Running instance: not a cold start
    assert woken == [] and not tracker.urgent.is_set()
    tracker(target(0), 0, 0)
    tracker(target(0), 0, 1)
    tracker(target(0), 0, 2)  # already waiting: signalled once
    assert woken == [VID] and tracker.urgent.is_set()


def test_the_gauges_follow_the_load_across_a_quiet_version_forgotten_and_seen_again() -> None:
    clock = Clock()
    registry = CollectorRegistry()
    metrics = InvocationMetrics(registry)
    tracker = LoadTracker(clock=clock, on_version=metrics.watch_load)
    t = target(1)
    labels = {"function_id": t.fid, "version_id": t.vid}

    def gauges() -> tuple[float | None, float | None]:
        return (
            registry.get_sample_value("nvcf_invocation_in_flight", labels),
            registry.get_sample_value("nvcf_invocation_queue_depth", labels),
        )

    assert gauges() == (None, None)  # no series before the version's first request
    tracker(t, 1, 2)
    assert gauges() == (1, 2)
    tracker(t, 0, 0)
    for step in (1.0, 2.0, 3.0):  # reported, reported as zeros, then forgotten
        clock.now = step
        tracker.snapshot()
    assert gauges() == (0, 0)
    tracker(t, 3, 0)  # a new record for the version: the gauges read it
    assert gauges() == (3, 0)


async def test_a_replica_reports_its_load_for_any_autoscaler(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    client = await invocation_app(
        client_factory, tmp_path, autoscale_enabled=False, autoscale_load_report_seconds=0.05
    )
    fn = await deployed(client, specs=[spec()])
    resp = await client.post(pexec_url(fn), json={}, headers={"NVCF-POLL-SECONDS": "30"})
    assert resp.status_code == 200
    maker: async_sessionmaker[AsyncSession] = client.app.state.sessionmaker
    version = uuid.UUID(fn["versionId"])

    async def reported() -> ReportedLoad | None:
        async with maker() as session:
            return (
                await session.execute(
                    select(ReportedLoad).where(ReportedLoad.version_id == version)
                )
            ).scalar_one_or_none()

    row = await eventually(reported)
    assert row.last_request_at is not None and row.waiting == 0
    async with maker() as session:
        reporter = (
            await session.execute(select(LoadReporter).where(LoadReporter.owner == row.owner))
        ).scalar_one()
    assert reporter.reported_at is not None
