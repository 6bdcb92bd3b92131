"""History of removed deployments: what stays readable after a deployment is removed, and the
purge that deletes it once it has expired.

When the reconciler removes a torn-down deployment (`transitions.remove_deployment`), a
`deployment_history` row keeps what the API showed of it — its GPU specifications and the
instances that failed — and its timeline stays in `deployment_events` (no foreign key). Both
answer, for the deployment's account only, until `expires_at` (the removal plus
`NVCF_HISTORY_RETENTION_SECONDS`): `GET /deployments/{id}`, `GET /deployments/{id}/events` and
`GET /deployments/functions/{fid}/versions/{vid}/history`. Reads compare `expires_at` with
now, so an expired entry is gone for the API even before the purge has run.

`HistoryPurger` is a loop service of its own (like the namespace collector): every
`NVCF_HISTORY_PURGE_SECONDS` it deletes what has expired, a bounded batch of entries at a time,
each step in its own session and transaction — the batch's timeline in chunks of
`event_chunk` rows, then the entries. A round that finds nothing expired is one probe of the
`expires_at` index, whatever the size of the fleet or of the history.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.core.db import utcnow
from service.core.loops import LoopService
from service.core.settings import Settings
from service.deployments import repository
from service.deployments.models import Deployment, DeploymentHistory, Instance
from service.deployments.schemas import GpuSpecificationOut, InstanceOut

log = logging.getLogger("nvcf.history")

Clock = Callable[[], datetime]

#: the settings' defaults, read once: each default is written in service/core/settings.py only
_DEFAULTS = Settings.model_construct()


# --- what is kept ------------------------------------------------------------------------------


def entry(
    deployment: Deployment, failed: Sequence[Instance], now: datetime, retention: timedelta
) -> DeploymentHistory:
    """The history row of `deployment`, removed at `now` with its `failed` instances; the
    specifications and instances are kept as the API showed them."""
    return DeploymentHistory(
        id=deployment.id,
        account_id=deployment.account_id,
        function_id=deployment.function_id,
        version_id=deployment.version_id,
        function_name=deployment.function_name,
        specifications=[
            GpuSpecificationOut.of(s).model_dump(mode="json", by_alias=True, exclude_none=True)
            for s in deployment.specs
        ],
        failed_instances=[
            InstanceOut(
                instance_id=i.id,
                gpu_specification_id=i.spec_id,
                cluster=i.cluster,
                phase=i.phase,
                reason=i.reason,
                message=i.message,
                since=i.since,
            ).model_dump(mode="json", by_alias=True, exclude_none=True)
            for i in failed
        ],
        created_at=deployment.created_at,
        removed_at=now,
        expires_at=now + retention,
    )


# --- the purge ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class HistoryConfig:
    """How long history is kept and how the purge paces itself."""

    #: seconds a removed deployment stays readable
    retention: float = _DEFAULTS.history_retention_seconds
    #: seconds between purge rounds (0: the loop does not run)
    period: float = _DEFAULTS.history_purge_seconds
    #: expired entries deleted per step
    batch: int = 100
    #: timeline rows deleted per statement (and transaction)
    event_chunk: int = 5000

    @classmethod
    def from_settings(cls, settings: Settings) -> HistoryConfig:
        return cls(
            retention=settings.history_retention_seconds,
            period=settings.history_purge_seconds,
        )


@dataclass
class PurgeReport:
    """One round: expired entries and timeline rows deleted, transactions used."""

    deployments: int = 0
    events: int = 0
    transactions: int = 0


class HistoryPurger(LoopService[str]):
    """Runs `purge()` every `config.period` seconds (0 disables the loop); `clock` is the now
    that expiry is compared with (injected by tests)."""

    def __init__(
        self,
        sessionmaker: async_sessionmaker[AsyncSession],
        config: HistoryConfig | None = None,
        *,
        clock: Clock | None = None,
    ) -> None:
        self.sessionmaker = sessionmaker
        self.config = config or HistoryConfig()
        self.clock = clock or utcnow
        self.last_report: PurgeReport | None = None
        super().__init__(
            "nvcf-history-purge",
            self.purge,
            self.config.period,
            log=log,
            failure="purging expired deployment history failed",
        )

    async def purge(self) -> PurgeReport:
        """Delete every entry expired at `clock()` with its timeline, batch by batch."""
        now = self.clock()
        report = PurgeReport()
        while True:
            ids = await self._expired(now, report)
            if not ids:
                break
            await self._delete_events(ids, report)
            deleted = await self._delete_entries(ids, now, report)
            report.deployments += deleted
            if len(ids) < self.config.batch or deleted == 0:
                break
            await asyncio.sleep(0)  # let the reconciler and requests in between batches
        if report.deployments:
            log.info(
                "purged the history of %d removed deployments (%d timeline entries)",
                report.deployments,
                report.events,
            )
        self.last_report = report
        return report

    async def _expired(self, now: datetime, report: PurgeReport) -> list[uuid.UUID]:
        async with self.sessionmaker() as session:
            report.transactions += 1
            return await repository.expired_history(session, now, self.config.batch)

    async def _delete_events(self, ids: Sequence[uuid.UUID], report: PurgeReport) -> None:
        chunk = self.config.event_chunk
        while True:
            async with self.sessionmaker() as session, session.begin():
                report.transactions += 1
                n = await repository.delete_history_events(session, ids, chunk)
            report.events += n
            if n < chunk:
                return
            await asyncio.sleep(0)

    async def _delete_entries(
        self, ids: Sequence[uuid.UUID], now: datetime, report: PurgeReport
    ) -> int:
        async with self.sessionmaker() as session, session.begin():
            report.transactions += 1
            return await repository.delete_history(session, ids, now)


__all__ = [
    "HistoryConfig",
    "HistoryPurger",
    "PurgeReport",
    "entry",
]
