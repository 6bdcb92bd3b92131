"""Keeping the last lines of an instance's containers: as it fails (before its teardown), and
when a container of a Running instance restarts (the run that ended).

Read from the backend as any log (current runs, then the previous run of restarted
containers: a crash loop's stack trace), at most `lines` lines and `max_bytes` bytes per
container, secrets masked, within `within` seconds: a backend that cannot answer costs the
kept lines, never the teardown. A restart is noticed by `restarted` comparing the containers'
restart counts with those of the instance's previous observation, so the backend's logs are
read only when a count went up, never on every pass.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from service.backends.logs import LogRequest, cut
from service.backends.protocol import AdapterError, BackendAdapter, InstanceSpec
from service.deployments import repository
from service.deployments.logs.mask import Masker
from service.deployments.models import Instance, KeptLog
from service.health.observed import ObservedState

log = logging.getLogger("nvcf.logs")

KEEP_TIMEOUT = 10.0
#: the bytes read of a container's tail: this many times the bytes kept, plus this many a line
KEEP_READ_FACTOR = 4
KEEP_READ_LINE = 1024

#: `(pod, container)` of a container, as the logs name it
ContainerKey = tuple[str, str]


def restart_counts(observed: ObservedState) -> dict[ContainerKey, int]:
    """The restart count of every container (init containers too) of the observed pods."""
    return {
        (pod.name, status.name): status.restart_count
        for pod in observed.pods
        for status in (*pod.init_container_statuses, *pod.container_statuses)
    }


def restarted(
    before: dict[ContainerKey, int] | None, now: dict[ContainerKey, int]
) -> frozenset[ContainerKey]:
    """The containers whose restart count went up since `before` (None: nothing known yet, as
    after the reconciler's own restart; a new pod starts from its own count)."""
    if before is None:
        return frozenset()
    return frozenset(k for k, count in now.items() if k in before and count > before[k])


def read_limit(lines: int, max_bytes: int) -> int:
    """The `limitBytes` of a kept read. The API server keeps the first bytes of the tail and
    the last ones matter here, hence room for ordinary lines well past the bytes kept; a
    worker printing huge lines costs at most this."""
    return KEEP_READ_FACTOR * max_bytes + KEEP_READ_LINE * lines


async def last_lines(
    adapter: BackendAdapter,
    target: InstanceSpec,
    masker: Masker,
    *,
    lines: int,
    max_bytes: int,
    within: float = KEEP_TIMEOUT,
    only: frozenset[ContainerKey] | None = None,
) -> list[dict[str, Any]]:
    """`[{pod, container, previous, lines}]` of every container that printed anything; with
    `only`, the previous run of those containers alone (a restart's)."""
    if lines <= 0:
        return []
    try:
        async with asyncio.timeout(within):
            return await _read(adapter, target, masker, lines, max_bytes, only)
    except (AdapterError, TimeoutError) as exc:
        detail = exc.message if isinstance(exc, AdapterError) else "timed out"
        log.warning("keeping the last lines of instance %s: %s", target.instance_id, detail)
        return []


async def _read(
    adapter: BackendAdapter,
    target: InstanceSpec,
    masker: Masker,
    lines: int,
    max_bytes: int,
    only: frozenset[ContainerKey] | None,
) -> list[dict[str, Any]]:
    out: dict[tuple[str, str, bool], list[str]] = {}
    for previous in (True,) if only is not None else (True, False):
        request = LogRequest(
            tail_lines=lines, previous=previous, limit_bytes=read_limit(lines, max_bytes)
        )
        async for line in adapter.logs(target, request):
            if only is not None and (line.pod, line.container) not in only:
                continue
            out.setdefault((line.pod, line.container, previous), []).append(cut(masker(line.text)))
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


async def keep_logs(
    session: AsyncSession, row: Instance, containers: list[dict[str, Any]], now: datetime
) -> None:
    """Store the lines read as `row` failed or restarted (in the transaction recording its
    observation), in place of those kept before (an earlier restart's)."""
    await repository.forget_kept_log(session, row.id)
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
    rows = await repository.kept_logs(session, ids)
    return {row.instance_id: shown(row.containers) for row in rows}
