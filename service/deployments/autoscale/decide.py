"""The autoscaler's decision, a pure function of (specifications, load, memory, policy, now).

- Signal: utilisation = (requests in flight + requests waiting) ÷ (Running instances ×
  `maxRequestConcurrency`), one sample per reading, averaged over the window; the samples
  restart after each decision (the next one is judged on the new instance count).
- Missing signal (no invocation replica reported its load recently) is never read as zero
  load: nothing changes, and the idle period of scale to zero starts again when it returns.
- Scale from zero: a request waits and the version has no instance wanted → one, at once.
- Scale up: the window's average above the up threshold, for the up stickiness, and every
  instance of the previous step Running → ⌈total × factor⌉, at most Σ maxInstances.
- Scale down: the average below the down threshold, for the down stickiness →
  ⌊total × factor⌋, at least max(Σ minInstances, 1).
- Scale to zero (every minInstances 0): no request for the idle period with the signal present
  all along, nothing in flight or waiting, the average below the down threshold.
- A new total is spread over the specifications one instance at a time, each within its own
  bounds: up to the one with the fewest (preferred first), down from the one with the most.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from service.deployments.autoscale.policy import Details, Policy


@dataclass(frozen=True)
class SpecView:
    """One GPU specification as the autoscaler sees it."""

    spec_id: uuid.UUID
    min_instances: int
    max_instances: int
    #: the desired count now (clamped to the bounds)
    target: int
    running: int
    concurrency: int
    #: (preferredOrder, position): lower goes first when instances are added
    order: tuple[int, int] = (1, 0)


@dataclass(frozen=True)
class Load:
    """The version's load summed over the replicas that reported it."""

    in_flight: float
    waiting: int
    last_request_at: datetime | None = None


@dataclass(frozen=True)
class Memory:
    """What the autoscaler keeps between readings (stored as JSON in `autoscale_state`)."""

    #: (epoch seconds, utilisation as a fraction) since the last decision
    samples: tuple[tuple[float, float], ...] = ()
    last_request_at: datetime | None = None
    #: since when the signal has been present without a gap (None: missing now)
    signal_since: datetime | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "samples": [[round(t, 3), round(u, 4)] for t, u in self.samples],
            "lastRequestAt": _iso(self.last_request_at),
            "signalSince": _iso(self.signal_since),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Memory:
        data = data or {}
        samples = data.get("samples") or []
        return cls(
            samples=tuple(
                (float(s[0]), float(s[1])) for s in samples if isinstance(s, list) and len(s) == 2
            ),
            last_request_at=_parse(data.get("lastRequestAt")),
            signal_since=_parse(data.get("signalSince")),
        )


@dataclass(frozen=True)
class Decision:
    """A reading's outcome: the new memory, and a change of the total when `direction`."""

    memory: Memory
    total_from: int
    total_to: int
    #: up | down | None (no change)
    direction: str | None = None
    #: why, for the timeline ("scale up", "scale from zero", …)
    reason: str = ""
    utilisation: float | None = None
    queue_depth: int = 0
    targets: dict[uuid.UUID, int] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return self.direction is not None


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _parse(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def spread(specs: Sequence[SpecView], total: int) -> dict[uuid.UUID, int]:
    """Each specification's target for `total` instances, changed one at a time from the
    current targets within each one's bounds; `total` is clamped to what the bounds allow."""
    targets = {s.spec_id: s.target for s in specs}
    total = max(
        sum(s.min_instances for s in specs), min(total, sum(s.max_instances for s in specs))
    )
    while sum(targets.values()) < total:
        room = [s for s in specs if targets[s.spec_id] < s.max_instances]
        pick = min(room, key=lambda s: (targets[s.spec_id], s.order))
        targets[pick.spec_id] += 1
    while sum(targets.values()) > total:
        room = [s for s in specs if targets[s.spec_id] > s.min_instances]
        pick = max(room, key=lambda s: (targets[s.spec_id], s.order))
        targets[pick.spec_id] -= 1
    return targets


def _time_past(
    samples: Sequence[tuple[float, float]], now: float, details: Details, above: bool
) -> float:
    """Seconds within the stickiness window during which utilisation was past the threshold
    (each sample stands for the time since the one before it)."""
    start = now - details.stickiness.size
    limit = details.threshold / 100
    past = 0.0
    previous: float | None = None
    for t, u in samples:
        if previous is not None and t >= start and ((u > limit) if above else (u < limit)):
            past += t - max(previous, start)
        previous = t
    return past


def _sticky(
    samples: Sequence[tuple[float, float]], now: float, details: Details, above: bool
) -> bool:
    needed = details.stickiness.threshold
    if needed <= 0:
        return True
    return _time_past(samples, now, details, above) >= needed


def decide(
    specs: Sequence[SpecView],
    load: Load | None,
    memory: Memory,
    policy: Policy,
    now: datetime,
    *,
    window: float,
    idle: float,
) -> Decision:
    """One reading of a version's load (see the module docstring)."""
    total = sum(s.target for s in specs)
    low = sum(s.min_instances for s in specs)
    high = sum(s.max_instances for s in specs)
    if load is None:
        # Missing signal is not zero load: hold, and start the idle period again later.
        return Decision(replace(memory, signal_since=None), total, total)
    last_request = max(
        (t for t in (memory.last_request_at, load.last_request_at) if t is not None),
        default=None,
    )
    signal_since = memory.signal_since or now
    mem = replace(memory, last_request_at=last_request, signal_since=signal_since)

    def change(to: int, direction: str, reason: str, utilisation: float | None) -> Decision:
        return Decision(
            replace(mem, samples=()),
            total,
            to,
            direction,
            reason,
            utilisation,
            load.waiting,
            spread(specs, to),
        )

    if load.waiting > 0 and total == 0 and high > 0:
        return change(1, "up", "scale from zero: a request waits and no instance runs", None)

    capacity = sum(s.running * s.concurrency for s in specs)
    epoch = now.timestamp()
    keep = max(window, policy.up.stickiness.size, policy.down.stickiness.size)
    samples = [(t, u) for t, u in mem.samples if t >= epoch - keep and t <= epoch]
    if capacity > 0:
        samples.append((epoch, (load.in_flight + load.waiting) / capacity))
    mem = replace(mem, samples=tuple(samples))
    recent = [u for t, u in samples if t >= epoch - window]
    average = sum(recent) / len(recent) if recent else None
    busy = load.in_flight > 0 or load.waiting > 0

    if low == 0 and total > 0 and not busy:
        idle_since = max(t for t in (last_request, signal_since) if t is not None)
        below = average is None or average * 100 < policy.down.threshold
        if below and now - idle_since >= timedelta(seconds=idle):
            return change(0, "down", f"scale to zero: no request for {idle:g} s", average)

    if average is None:
        return Decision(mem, total, total, utilisation=None, queue_depth=load.waiting)
    running = sum(s.running for s in specs)
    up, down = policy.up, policy.down
    if (
        average * 100 > up.threshold
        and total < high
        and running >= total
        and _sticky(samples, epoch, up, above=True)
    ):
        to = min(high, max(total + 1, math.ceil(round(total * up.factor, 6))))
        return change(to, "up", "scale up", average)
    floor = max(low, 1)
    if average * 100 < down.threshold and total > floor and _sticky(samples, epoch, down, False):
        to = max(floor, min(total - 1, math.floor(round(total * down.factor, 6))))
        return change(to, "down", "scale down", average)
    return Decision(mem, total, total, utilisation=average, queue_depth=load.waiting)


__all__ = ["Decision", "Load", "Memory", "SpecView", "decide", "spread"]
