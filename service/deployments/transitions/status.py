"""A function version's status: the one place it changes, with its timeline event and wording
(`function version status A → B[ (cause)][: detail]`)."""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm.attributes import set_committed_value

from service.core.changes import touching
from service.deployments.events import record_event
from service.functions.models import FunctionVersion
from service.health.status import VersionStatus


def status_of(version: FunctionVersion) -> VersionStatus:
    """The stored status as an enum (an unknown value reads as DEPLOYING, to be recomputed)."""
    try:
        return VersionStatus(version.status)
    except ValueError:
        return VersionStatus.DEPLOYING


def status_message(
    previous: VersionStatus, to: VersionStatus, *, cause: str | None, detail: str | None
) -> str:
    """The one wording of a status change on the timeline."""
    text = f"function version status {previous} → {to}"
    if cause:
        text += f" ({cause})"
    if detail:
        text += f": {detail}"
    return text


@dataclass(frozen=True)
class StatusChange:
    """A wanted move of one version's status, with what the timeline should say about it."""

    deployment_id: uuid.UUID
    version: FunctionVersion
    to: VersionStatus
    cause: str | None = None
    detail: str | None = None
    reason: str | None = None


async def set_version_statuses(
    session: AsyncSession, changes: Sequence[StatusChange], now: datetime
) -> list[StatusChange]:
    """Move each version to its new status if it still has the status it was read with
    (compare-and-set, so two writers never both record a change) and record the events; the
    changes that took place. One statement per (from, to) pair; loaded objects follow."""
    groups: dict[tuple[str, VersionStatus], list[StatusChange]] = defaultdict(list)
    for change in changes:
        if status_of(change.version) is not change.to:
            groups[(change.version.status, change.to)].append(change)
    done: list[StatusChange] = []
    for (stored, to), group in groups.items():
        changed = set(
            (
                await session.execute(
                    update(FunctionVersion)
                    .where(
                        FunctionVersion.id.in_([c.version.id for c in group]),
                        FunctionVersion.status == stored,
                    )
                    .values(status=to.value, updated_at=now)
                    .returning(FunctionVersion.id)
                    .execution_options(
                        synchronize_session=False, **touching(c.version.id for c in group)
                    )
                )
            ).scalars()
        )
        for c in group:
            if c.version.id not in changed:
                continue
            previous = status_of(c.version)
            set_committed_value(c.version, "status", to.value)
            set_committed_value(c.version, "updated_at", now)
            record_event(
                session,
                c.deployment_id,
                "status",
                status_message(previous, to, cause=c.cause, detail=c.detail),
                reason=c.reason,
            )
            done.append(c)
    return done


async def set_version_status(
    session: AsyncSession,
    deployment_id: uuid.UUID,
    version: FunctionVersion,
    to: VersionStatus,
    now: datetime,
    *,
    cause: str | None = None,
) -> bool:
    """`set_version_statuses` for one version; whether it moved."""
    change = StatusChange(deployment_id, version, to, cause=cause)
    return bool(await set_version_statuses(session, [change], now))
