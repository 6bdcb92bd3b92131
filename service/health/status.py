"""Function version status aggregation (runtime.md §6), a pure function of counts and flags."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


class VersionStatus(StrEnum):
    ACTIVE = "ACTIVE"
    DEPLOYING = "DEPLOYING"
    ERROR = "ERROR"
    INACTIVE = "INACTIVE"
    DEGRADED = "DEGRADED"
    DEGRADING = "DEGRADING"


INVOCABLE = frozenset({VersionStatus.ACTIVE, VersionStatus.DEGRADING})


def is_invocable(status: VersionStatus) -> bool:
    """Only ACTIVE and DEGRADING versions accept invocations."""
    return status in INVOCABLE


@dataclass(frozen=True)
class SpecProgress:
    """One deployment specification: its `minInstances` and how many instances are Running."""

    min_instances: int
    running: int

    @property
    def satisfied(self) -> bool:
        return self.running >= self.min_instances


def next_status(
    previous: VersionStatus | None,
    *,
    deployed: bool,
    specs: Sequence[SpecProgress] = (),
    instance_failed: bool = False,
) -> VersionStatus:
    """The version's status after one reconciliation pass.

    `previous` None is a version just created. `instance_failed` says an instance of the version
    failed in this pass; it only matters while DEPLOYING (afterwards failures are replaced).
    """
    if not deployed:
        return VersionStatus.INACTIVE
    prev = previous or VersionStatus.INACTIVE
    satisfied = all(s.satisfied for s in specs)
    running = sum(s.running for s in specs)

    if prev is VersionStatus.ERROR:
        return VersionStatus.ERROR  # only undeploying leaves ERROR
    if prev in (VersionStatus.INACTIVE, VersionStatus.DEPLOYING):
        if satisfied:
            # Checked before failures: a version that reached its minimum is no longer deploying,
            # so its failed instance is replaced rather than failing the version.
            return VersionStatus.ACTIVE
        if instance_failed:
            return VersionStatus.ERROR
        return VersionStatus.DEPLOYING
    # ACTIVE, DEGRADING, DEGRADED
    if satisfied:
        return VersionStatus.ACTIVE
    if running == 0:
        return VersionStatus.DEGRADED
    return VersionStatus.DEGRADING
