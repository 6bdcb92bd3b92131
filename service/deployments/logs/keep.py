"""Keeping the last lines of a failed instance's containers (before its teardown).

Read from the backend as any log (current runs, then the previous run of restarted
containers: a crash loop's stack trace), at most `lines` lines and `max_bytes` bytes per
container, secrets masked, within `within` seconds: a backend that cannot answer costs the
kept lines, never the teardown.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from service.backends.logs import LogRequest
from service.backends.protocol import AdapterError, BackendAdapter, InstanceSpec
from service.deployments.logs.mask import Masker
from service.deployments.logs.models import KeptLog
from service.deployments.models import Instance

log = logging.getLogger("nvcf.logs")

KEEP_TIMEOUT = 10.0


async def last_lines(
    adapter: BackendAdapter,
    target: InstanceSpec,
    masker: Masker,
    *,
    lines: int,
    max_bytes: int,
    within: float = KEEP_TIMEOUT,
) -> list[dict[str, Any]]:
    """`[{pod, container, previous, lines}]` of every container that printed anything."""
    if lines <= 0:
        return []
    try:
        return await asyncio.wait_for(
            _read(adapter, target, masker, lines, max_bytes), timeout=within
        )
    except (AdapterError, TimeoutError) as exc:
        detail = exc.message if isinstance(exc, AdapterError) else "timed out"
        log.warning("keeping the last lines of instance %s: %s", target.instance_id, detail)
        return []


async def _read(
    adapter: BackendAdapter, target: InstanceSpec, masker: Masker, lines: int, max_bytes: int
) -> list[dict[str, Any]]:
    out: dict[tuple[str, str, bool], list[str]] = {}
    for previous in (True, False):
        # no limitBytes: the kubelet keeps the first bytes, and the last ones matter here (the
        # read is bounded by its lines, each cut at MAX_LINE_BYTES)
        request = LogRequest(tail_lines=lines, previous=previous)
        async for line in adapter.logs(target, request):
            out.setdefault((line.pod, line.container, previous), []).append(masker(line.text))
    kept: list[dict[str, Any]] = []
    # per container: the run before a restart first, then the current run
    for (pod, container, previous), texts in sorted(
        out.items(), key=lambda i: (*i[0][:2], not i[0][2])
    ):
        used, bounded = 0, []
        for text in reversed(texts[-lines:]):  # the last lines are the ones that matter
            used += len(text.encode()) + 1
            if used > max_bytes:
                break
            bounded.append(text)
        bounded.reverse()
        kept.append({"pod": pod, "container": container, "previous": previous, "lines": bounded})
    return kept


def keep_logs(
    session: AsyncSession, row: Instance, containers: list[dict[str, Any]], now: datetime
) -> None:
    """Store the lines read as `row` failed (in the transaction recording its failure)."""
    session.add(
        KeptLog(
            instance_id=row.id,
            deployment_id=row.deployment_id,
            account_id=row.account_id,
            captured_at=now,
            containers=containers,
        )
    )


def shown(containers: list[dict[str, Any]]) -> list[str]:
    """Kept lines as the API shows them: each prefixed with its pod and container (and
    `previous` for the run before a restart)."""
    out: list[str] = []
    for entry in containers:
        where = f"{entry.get('pod')}/{entry.get('container')}"
        if entry.get("previous"):
            where += " previous"
        out.extend(f"[{where}] {text}" for text in entry.get("lines") or [])
    return out


async def kept_lines(
    session: AsyncSession, instance_ids: Iterable[uuid.UUID]
) -> dict[uuid.UUID, list[str]]:
    """The kept last lines of these instances, as shown (one query)."""
    ids = list(dict.fromkeys(instance_ids))
    if not ids:
        return {}
    rows = (await session.execute(select(KeptLog).where(KeptLog.instance_id.in_(ids)))).scalars()
    return {row.instance_id: shown(row.containers) for row in rows}
