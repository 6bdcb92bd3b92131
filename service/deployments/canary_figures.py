"""What the engine measured of a release's versions, step by step (docs/rollouts.md, "Canary
releases"): each invocation replica counts, per version under a release, the requests, those
that failed and their latencies in fixed buckets (invocation/figures.py), and adds them every
report to its own row of the release's current step (table `canary_figures`). A release's
decision sums a step's rows over the replicas (`figures_of`): every replica's requests count,
and a restarted process finds what was measured before it stopped.

Latencies are counted in `BOUNDS` (1 ms growing by a quarter to about 5 minutes, and one bucket
above); the p95 is interpolated within its bucket, so it is within 25 % of the true value.
"""

from __future__ import annotations

import bisect
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from service.deployments.canary import Figures, Phase
from service.deployments.models import CanaryFigures, CanaryRelease

#: upper bounds (seconds) of the latency buckets; one more bucket counts what is above the last
BOUNDS: tuple[float, ...] = tuple(0.001 * 1.25**i for i in range(57))
BUCKETS = len(BOUNDS) + 1


def bucket_of(seconds: float) -> int:
    return bisect.bisect_left(BOUNDS, seconds)


def quantile(counts: Sequence[int], q: float) -> float:
    """The `q` quantile of the latencies counted in `counts` (0.0 when there are none)."""
    total = sum(counts)
    if total == 0:
        return 0.0
    rank = q * total
    seen = 0
    for i, n in enumerate(counts):
        if n and seen + n >= rank:
            low = BOUNDS[i - 1] if i > 0 else 0.0
            high = BOUNDS[i] if i < len(BOUNDS) else BOUNDS[-1]
            return low + (high - low) * (rank - seen) / n
        seen += n
    return BOUNDS[-1]


@dataclass
class Tally:
    """Requests of one version counted since the last report (`add` per request)."""

    requests: int = 0
    errors: int = 0
    latency: list[int] = field(default_factory=lambda: [0] * BUCKETS)

    def add(self, failed: bool, seconds: float) -> None:
        self.requests += 1
        self.errors += failed
        self.latency[bucket_of(seconds)] += 1

    def merge(self, other: Tally) -> None:
        self.requests += other.requests
        self.errors += other.errors
        self.latency = [a + b for a, b in zip(self.latency, other.latency, strict=True)]

    def figures(self) -> Figures:
        return Figures(self.requests, self.errors, quantile(self.latency, 0.95))


def _tally(row: CanaryFigures) -> Tally:
    latency = list(row.latency) if len(row.latency) == BUCKETS else [0] * BUCKETS
    return Tally(row.requests, row.errors, latency)


@dataclass(frozen=True)
class Watched:
    """A version under a release: the release, its current step, the function, the version's
    role (`canary` or `stable`) and its weight now."""

    release_id: uuid.UUID
    step: int
    function_id: uuid.UUID
    role: str
    weight: int


async def watched(session: AsyncSession) -> dict[uuid.UUID, Watched]:
    """The versions of the releases under way."""
    rows = await session.execute(
        select(
            CanaryRelease.id,
            CanaryRelease.step,
            CanaryRelease.function_id,
            CanaryRelease.canary_version_id,
            CanaryRelease.stable_version_id,
            CanaryRelease.plan,
        ).where(CanaryRelease.phase.in_((Phase.RUNNING.value, Phase.PAUSED.value)))
    )
    found: dict[uuid.UUID, Watched] = {}
    for r in rows:
        steps = r.plan.get("steps") if isinstance(r.plan, dict) else None
        weight = int(steps[r.step]["weight"]) if steps and r.step < len(steps) else 0
        found[r.canary_version_id] = Watched(r.id, r.step, r.function_id, "canary", weight)
        found[r.stable_version_id] = Watched(r.id, r.step, r.function_id, "stable", 100 - weight)
    return found


async def report(
    session: AsyncSession,
    owner: str,
    tallies: Mapping[uuid.UUID, Tally],
    releases: Mapping[uuid.UUID, Watched],
) -> None:
    """Add `owner`'s tallies to its rows of each version's release step (in the caller's
    transaction; only this owner writes these rows)."""
    for version_id, tally in tallies.items():
        where = releases.get(version_id)
        if where is None or not tally.requests:
            continue
        key = {
            "release_id": where.release_id,
            "step": where.step,
            "owner": owner,
            "version_id": version_id,
        }
        row = await session.get(CanaryFigures, key)
        if row is None:
            session.add(CanaryFigures(**key, requests=0, errors=0, latency=[0] * BUCKETS))
            await session.flush()
            row = await session.get(CanaryFigures, key)
            assert row is not None
        total = _tally(row)
        total.merge(tally)
        row.requests, row.errors, row.latency = total.requests, total.errors, total.latency


async def figures_of(
    session: AsyncSession, release_id: uuid.UUID, step: int, version_id: uuid.UUID
) -> Figures:
    """One version's figures over a release's step, summed over the replicas."""
    rows = await session.scalars(
        select(CanaryFigures).where(
            CanaryFigures.release_id == release_id,
            CanaryFigures.step == step,
            CanaryFigures.version_id == version_id,
        )
    )
    total = Tally()
    for row in rows:
        total.merge(_tally(row))
    return total.figures()
