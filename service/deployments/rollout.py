"""Rolling a spec's instances to its target revision, and draining retired ones: pure decisions.

`decide` is what the reconciler does with one spec's wanted instances on each unit of work,
given how many it must run (`desired`: minInstances today, a target count from the autoscaler
later — one input either way). Without a rollout it converges the count (create the missing,
retire the surplus, not serving first). During a rollout (some wanted instance runs another
revision than the target) it surges one: start one instance on the target revision, wait until
it is Running, then retire one old instance; repeat until every instance runs the target. An
old instance that is not Running serves nobody and is retired at once. A target-revision
instance that fails ends the rollout (`failed`): the reconciler puts the target back to the
revision that serves and retires the failed revision's instances.

`drained` says when a retired instance may be torn down: at once when it was not serving, else
once it has no request in flight (nor waiting, for a graceful undeploy) and routes had time to
forget it, or when the drain timeout has passed.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum


class RolloutState(StrEnum):
    PROGRESSING = "progressing"
    COMPLETED = "completed"
    FAILED = "failed"


@dataclass(frozen=True)
class Member:
    """One wanted instance of the spec, as the decision needs it."""

    id: uuid.UUID
    revision: int
    running: bool
    created_at: datetime


@dataclass(frozen=True)
class Decision:
    """What to do now: instances to create on the target revision, instances to retire, and
    whether the rollout has just completed."""

    create: int = 0
    retire: tuple[uuid.UUID, ...] = ()
    completed: bool = False
    #: the retirements replace old-revision instances (else: surplus of a scale-down)
    rolling: bool = False
    waiting: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)


def decide(desired: int, target: int, members: Sequence[Member], *, rolling: bool) -> Decision:
    """One spec's next step (see the module docstring); `rolling`: a rollout is recorded as
    progressing on the spec."""
    old = [m for m in members if m.revision != target]
    new = [m for m in members if m.revision == target]
    if not old:
        missing = desired - len(new)
        if missing >= 0:
            done = rolling and missing == 0 and all(m.running for m in new)
            return Decision(create=missing, completed=done, rolling=rolling and not done)
        # Scale down: drop instances that are not serving first, oldest first.
        surplus = sorted(new, key=lambda m: (m.running, m.created_at))[:-missing]
        kept = [m for m in new if m not in surplus]
        done = rolling and all(m.running for m in kept)
        return Decision(
            retire=tuple(m.id for m in surplus), completed=done, rolling=rolling and not done
        )
    idle_old = [m for m in old if not m.running]
    if idle_old:
        return Decision(retire=tuple(m.id for m in idle_old), rolling=True)
    if any(not m.running for m in new):
        return Decision(waiting=True, rolling=True)  # the surge instance is starting
    if len(new) + len(old) > desired:
        oldest = min(old, key=lambda m: (m.created_at, str(m.id)))
        return Decision(retire=(oldest.id,), rolling=True)
    return Decision(create=1, rolling=True)


def drained(
    *,
    since: datetime,
    now: datetime,
    timeout: float,
    grace: float,
    in_flight: int | None,
    waiting: int = 0,
) -> bool:
    """Whether a draining instance may be torn down: the drain timeout has passed, or it has
    nothing in flight or waiting and routes had `grace` seconds to forget it. `in_flight`
    None: unknown (no view of the invocation plane): only the timeout ends the drain."""
    if now >= since + timedelta(seconds=timeout):
        return True
    if in_flight is None:
        return False
    return in_flight == 0 and waiting == 0 and now >= since + timedelta(seconds=grace)


__all__ = ["Decision", "Member", "RolloutState", "decide", "drained"]
