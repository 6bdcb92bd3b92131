"""The autoscaler, a loop service of its own (docs/autoscaling.md).

Every `NVCF_AUTOSCALE_INTERVAL` seconds it reads the load the invocation replicas reported
(load_signal.py), picks the deployments worth a reading and, in one transaction per batch, locks
their rows (`FOR UPDATE`, skipping rows another replica holds; SQLite has one writer), reads
their Running instances and its memory, decides (autoscale/decide.py, a pure function) and
writes the new memory (compare-and-set on its revision) and, when the count changes, the specs'
targets with a `scaling` event (transitions.set_targets). The reconciler is woken after the commit.

`wake(version_id)` — a request waits for a version with no instance in this process — reads
that version at once, waiting for its row lock, with the waiting request counted even before
its replica's report reaches the database: the cold start begins within milliseconds.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.core.db import utcnow
from service.core.loops import LoopService
from service.core.settings import Settings
from service.deployments import transitions
from service.deployments.autoscale.decide import Decision, Load, Memory, SpecView, decide
from service.deployments.autoscale.policy import Policy, platform_from_settings, version_policy
from service.deployments.autoscaler.store import AutoscaleStore
from service.deployments.metrics import AutoscaleMetrics
from service.deployments.models import Deployment

log = logging.getLogger("nvcf.autoscaler")

Clock = Callable[[], datetime]
#: deployments locked together in one transaction
BATCH = 100
_REASONS = {
    ("up", True): "ScaledFromZero",
    ("up", False): "ScaledUp",
    ("down", True): "ScaledToZero",
    ("down", False): "ScaledDown",
}


@dataclass(frozen=True)
class AutoscalerConfig:
    interval: float
    window: float
    idle: float
    stale: float
    platform: Policy

    @classmethod
    def from_settings(cls, settings: Settings) -> AutoscalerConfig:
        return cls(
            interval=settings.autoscale_interval,
            window=settings.autoscale_window_seconds,
            idle=settings.autoscale_idle_seconds,
            stale=settings.autoscale_load_stale_seconds,
            platform=platform_from_settings(settings),
        )


@dataclass
class AutoscaleReport:
    """One reading: deployments read, decisions taken, and whether there was a signal."""

    deployments: int = 0
    decisions: list[tuple[uuid.UUID, Decision]] = field(default_factory=list)
    signal: bool = True


class Autoscaler(LoopService[uuid.UUID]):
    def __init__(
        self,
        sessionmaker: async_sessionmaker[AsyncSession],
        config: AutoscalerConfig,
        *,
        metrics: AutoscaleMetrics | None = None,
        clock: Clock = utcnow,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.store = AutoscaleStore(sessionmaker)
        self.config = config
        self.metrics = metrics if metrics is not None else AutoscaleMetrics()
        self.clock = clock
        #: called after a committed change of targets (the reconciler's wake)
        self.on_change = on_change
        self.readings = 0
        self._lock = asyncio.Lock()
        self._signal = True
        super().__init__(
            "nvcf-autoscaler",
            self.run_once,
            config.interval,
            log=log,
            failure="autoscaler reading failed",
            urgent=self.run_once,
        )

    # ------------------------------------------------------------------ one reading

    async def run_once(self, urgent: set[uuid.UUID] | None = None) -> AutoscaleReport:
        """One reading of every deployment worth it, or of the `urgent` versions only."""
        async with self._lock:
            self.readings += 1
            now = self.clock()
            report = AutoscaleReport()
            fresh_since = now - timedelta(seconds=self.config.stale)
            idle = max(self.config.idle, self.config.window)
            loads = await self.store.loads(fresh_since, now - timedelta(seconds=idle))
            report.signal = loads is not None
            self.metrics.read(report.signal)
            if report.signal != self._signal:
                self._signal = report.signal
                if report.signal:
                    log.info("the invocation replicas report their load again")
                else:
                    log.warning(
                        "no invocation replica reported its load in the last %g s: holding "
                        "every instance count (missing load is not zero load)",
                        self.config.stale,
                    )
            versions = set(urgent or ()) | (set() if urgent else set(loads or {}))
            ids = await self.store.candidates(versions, only=bool(urgent))
            changed = False
            for i in range(0, len(ids), BATCH):
                batch = ids[i : i + BATCH]
                changed = await self._batch(batch, loads, urgent, now, report) or changed
            if changed and self.on_change is not None:
                self.on_change()
            return report

    async def _batch(
        self,
        ids: Sequence[uuid.UUID],
        loads: dict[uuid.UUID, Load] | None,
        urgent: set[uuid.UUID] | None,
        now: datetime,
        report: AutoscaleReport,
    ) -> bool:
        changed = False
        async with self.store.sessionmaker() as session, session.begin():
            deps = await self.store.lock(session, ids, skip_locked=not urgent)
            if not deps:
                return False
            running = await self.store.running(session, [d.id for d in deps])
            states = await self.store.states(session, [d.id for d in deps])
            for dep in deps:
                specs = _views(dep, running)
                if all(s.min_instances == s.max_instances for s in specs):
                    continue  # nothing to decide
                previous = states.get(dep.id)
                if (
                    not urgent
                    and previous is not None
                    and now - previous.updated_at < timedelta(seconds=self.config.interval / 2)
                ):
                    continue  # another replica read it a moment ago
                load = _load(loads, dep.version_id, urgent)
                decision = decide(
                    specs,
                    load,
                    Memory.from_json(previous.state if previous is not None else None),
                    self._policy(dep),
                    now,
                    window=self.config.window,
                    idle=self.config.idle,
                )
                report.deployments += 1
                if not await self.store.save(
                    session, dep, previous, decision.memory.to_json(), now
                ):
                    continue  # another replica wrote first: its reading stands
                self.metrics.target(str(dep.function_id), str(dep.version_id), decision.total_to)
                if decision.changed:
                    changed = self._apply(session, dep, decision, now) or changed
                    report.decisions.append((dep.id, decision))
        return changed

    def _policy(self, dep: Deployment) -> Policy:
        ordered = sorted(dep.specs, key=lambda s: (s.preferred_order, s.position))
        return version_policy(
            ((s.autoscaling_policy, s.autoscaling_configuration) for s in ordered),
            self.config.platform,
        )

    def _apply(
        self, session: AsyncSession, dep: Deployment, decision: Decision, now: datetime
    ) -> bool:
        direction = decision.direction or "up"
        zero = decision.total_from == 0 or decision.total_to == 0
        utilisation = (
            f"utilisation {decision.utilisation:.0%}"
            if decision.utilisation is not None
            else "utilisation unknown (no instance Running)"
        )
        message = (
            f"autoscaler: {decision.total_from} → {decision.total_to} instances "
            f"({decision.reason}; {utilisation}, queue depth {decision.queue_depth}, "
            f"policy {self._policy(dep).name})"
        )
        done = transitions.set_targets(
            session,
            dep,
            decision.targets,
            now,
            reason=_REASONS[(direction, zero)],
            message=message,
        )
        if done:
            self.metrics.decided(direction)
            log.info("deployment %s: %s", dep.id, message)
        return done


def _views(dep: Deployment, running: dict[uuid.UUID, int]) -> list[SpecView]:
    return [
        SpecView(
            spec_id=s.id,
            min_instances=s.floor_instances,
            max_instances=s.max_instances,
            target=s.desired_instances,
            running=running.get(s.id, 0),
            concurrency=max(1, s.max_request_concurrency),
            order=(s.preferred_order, s.position),
        )
        for s in dep.specs
    ]


def _load(
    loads: dict[uuid.UUID, Load] | None, version_id: uuid.UUID, urgent: set[uuid.UUID] | None
) -> Load | None:
    """The version's load; a version woken in this process has a request waiting even before
    its replica's report reaches the database."""
    if urgent and version_id in urgent:
        base = (loads or {}).get(version_id, Load(0.0, 0, None))
        return replace(base, waiting=max(1, base.waiting), last_request_at=utcnow())
    if loads is None:
        return None
    return loads.get(version_id, Load(0.0, 0, None))


__all__ = ["AutoscaleReport", "Autoscaler", "AutoscalerConfig"]
