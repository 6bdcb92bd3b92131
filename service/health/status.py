"""Function version status aggregation (runtime.md §6), a pure function of counts and flags."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from service.core.settings import Settings


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


#: instances tried per instance of a specification's minimum while DEPLOYING, by default
#: (NVCF_RECONCILE_DEPLOY_ATTEMPTS; the reconciler passes the configured value)
DEFAULT_DEPLOY_ATTEMPTS = Settings.model_construct().reconcile_deploy_attempts


@dataclass(frozen=True)
class SpecProgress:
    """One deployment specification: its `minInstances`, how many instances are Running, how
    many are wanted (`present`: starting or running), and, over the deployment's life, how
    many instances were created for it (`tried`) and how many of those failed (`failed`).
    `wanted` is the count the reconciler converges to (the autoscaler's target within
    [minInstances, maxInstances]; None: `min_instances`)."""

    min_instances: int
    running: int
    present: int | None = None
    tried: int = 0
    failed: int = 0
    wanted: int | None = None

    @property
    def satisfied(self) -> bool:
        return self.running >= self.min_instances

    @property
    def live(self) -> int:
        return self.running if self.present is None else self.present

    def budget(self, attempts: int) -> int:
        """How many instances the spec may try while DEPLOYING."""
        return self.min_instances * max(attempts, 1)

    def exhausted(self, attempts: int) -> bool:
        """Below its minimum, out of attempts, and nothing of it still starting: the spec can
        no longer reach its minimum."""
        return (
            not self.satisfied and self.tried >= self.budget(attempts) and self.live <= self.running
        )


def attempts_left(
    progress: SpecProgress, status: VersionStatus | None, attempts: int
) -> int | None:
    """How many more instances the spec may create: no bound (None) once the version has left
    DEPLOYING; while DEPLOYING, what is left of its attempts."""
    if status not in (None, VersionStatus.INACTIVE, VersionStatus.DEPLOYING):
        return None
    return max(progress.budget(attempts) - progress.tried, 0)


def may_replace(progress: SpecProgress, status: VersionStatus | None, attempts: int) -> int:
    """How many of the spec's missing instances may be created now: all of them once the
    version has left DEPLOYING; while DEPLOYING, only within the spec's attempts."""
    wanted = progress.min_instances if progress.wanted is None else progress.wanted
    missing = max(wanted - progress.live, 0)
    left = attempts_left(progress, status, attempts)
    return missing if left is None else min(missing, left)


def deploy_failed(specs: Sequence[SpecProgress], attempts: int) -> str | None:
    """Why a DEPLOYING version goes to ERROR, or None (runtime.md §6): as many instances as the
    minimum have been tried and every one failed (no instance left), or some specification
    used all its attempts without reaching its minimum."""
    minimum = sum(s.min_instances for s in specs)
    failed = sum(s.failed for s in specs)
    if minimum > 0 and failed >= minimum and sum(s.live for s in specs) == 0:
        return f"all {failed} instances tried failed (minimum {minimum})"
    for s in specs:
        if s.exhausted(attempts):
            return (
                f"{s.failed} of the {s.tried} instances tried failed; out of attempts "
                f"({attempts} per instance of the minimum) with {s.running} of "
                f"{s.min_instances} Running"
            )
    return None


def next_status(
    previous: VersionStatus | None,
    *,
    deployed: bool,
    specs: Sequence[SpecProgress] = (),
    attempts: int = DEFAULT_DEPLOY_ATTEMPTS,
) -> VersionStatus:
    """The version's status after one reconciliation pass.

    `previous` None is a version just created. While DEPLOYING, failures are replaced within
    `attempts` per instance of the minimum; the version goes to ERROR only as
    `deploy_failed` says. Afterwards failures are always replaced.
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
        if deploy_failed(specs, attempts) is not None:
            return VersionStatus.ERROR
        return VersionStatus.DEPLOYING
    # ACTIVE, DEGRADING, DEGRADED
    if satisfied:
        return VersionStatus.ACTIVE
    if running == 0:
        return VersionStatus.DEGRADED
    return VersionStatus.DEGRADING
