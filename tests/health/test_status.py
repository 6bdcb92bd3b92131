"""Function version status: every row of the runtime.md §6 table."""

from __future__ import annotations

import pytest

from service.health import SpecProgress, VersionStatus, is_invocable, next_status
from service.health.status import deploy_failed, may_replace

S = VersionStatus


def specs(*pairs: tuple[int, int]) -> list[SpecProgress]:
    return [SpecProgress(min_instances=m, running=r) for m, r in pairs]


def spec(minimum: int, running: int, present: int, tried: int, failed: int) -> list[SpecProgress]:
    """One spec: (min, running, present = starting or running, tried, failed)."""
    return [SpecProgress(minimum, running, present=present, tried=tried, failed=failed)]


ROWS: list[tuple[str, VersionStatus | None, bool, list[SpecProgress], VersionStatus]] = [
    # (row, from, deployed, specs, to) with 3 attempts per instance of the minimum
    ("created", None, False, [], S.INACTIVE),
    ("deployed with some min > 0", S.INACTIVE, True, specs((1, 0), (0, 0)), S.DEPLOYING),
    ("deployed with every min = 0", S.INACTIVE, True, specs((0, 0), (0, 0)), S.ACTIVE),
    ("still deploying", S.DEPLOYING, True, specs((2, 1)), S.DEPLOYING),
    ("every spec reached its minimum", S.DEPLOYING, True, specs((1, 1), (2, 3)), S.ACTIVE),
    ("one spec short is not ACTIVE", S.DEPLOYING, True, specs((1, 1), (2, 1)), S.DEPLOYING),
    # min 2: one of two failed, the other still starting: replaced, not ERROR
    ("one failure of two is replaced", S.DEPLOYING, True, spec(2, 0, 1, 2, 1), S.DEPLOYING),
    ("one failure of two, other Running", S.DEPLOYING, True, spec(2, 1, 1, 2, 1), S.DEPLOYING),
    ("the replacement runs", S.DEPLOYING, True, spec(2, 2, 2, 3, 1), S.ACTIVE),
    # as many as the minimum tried, every one failed
    ("min 1: its instance failed", S.DEPLOYING, True, spec(1, 0, 0, 1, 1), S.ERROR),
    ("min 2: both failed", S.DEPLOYING, True, spec(2, 0, 0, 2, 2), S.ERROR),
    ("never scheduled for lack of capacity", S.DEPLOYING, True, spec(1, 0, 0, 1, 1), S.ERROR),
    ("fewer failures than the minimum", S.DEPLOYING, True, spec(3, 0, 0, 2, 2), S.DEPLOYING),
    ("failures, a replacement starting", S.DEPLOYING, True, spec(2, 0, 1, 3, 2), S.DEPLOYING),
    (
        "every instance of every spec failed",
        S.DEPLOYING,
        True,
        [*spec(1, 0, 0, 1, 1), *spec(1, 0, 0, 2, 2)],
        S.ERROR,
    ),
    (
        "one spec failed, the other still starting",
        S.DEPLOYING,
        True,
        [*spec(1, 0, 0, 1, 1), *spec(1, 0, 1, 1, 0)],
        S.DEPLOYING,
    ),
    # bounded attempts: min 2 × 3 attempts = 6 tried
    ("out of attempts, nothing starting", S.DEPLOYING, True, spec(2, 1, 1, 6, 5), S.ERROR),
    ("out of attempts, one starting", S.DEPLOYING, True, spec(2, 1, 2, 6, 4), S.DEPLOYING),
    ("attempts left", S.DEPLOYING, True, spec(2, 1, 1, 5, 4), S.DEPLOYING),
    ("ACTIVE, some but fewer than min", S.ACTIVE, True, specs((2, 1)), S.DEGRADING),
    ("ACTIVE, no Running instance", S.ACTIVE, True, specs((2, 0), (1, 0)), S.DEGRADED),
    ("DEGRADING, no Running instance", S.DEGRADING, True, specs((2, 0)), S.DEGRADED),
    ("DEGRADING back to min", S.DEGRADING, True, specs((2, 2)), S.ACTIVE),
    ("DEGRADED back to min", S.DEGRADED, True, specs((1, 1), (1, 2)), S.ACTIVE),
    ("ACTIVE stays ACTIVE", S.ACTIVE, True, specs((1, 1)), S.ACTIVE),
    ("ACTIVE failure is replaced, not ERROR", S.ACTIVE, True, spec(1, 0, 0, 9, 9), S.DEGRADED),
    ("ERROR stays ERROR while deployed", S.ERROR, True, specs((1, 1)), S.ERROR),
    ("ACTIVE deployment deleted", S.ACTIVE, False, [], S.INACTIVE),
    ("DEPLOYING deployment deleted", S.DEPLOYING, False, [], S.INACTIVE),
    ("ERROR deployment deleted", S.ERROR, False, [], S.INACTIVE),
    ("DEGRADED deployment deleted", S.DEGRADED, False, [], S.INACTIVE),
    ("DEGRADING deployment deleted", S.DEGRADING, False, [], S.INACTIVE),
]


@pytest.mark.parametrize(
    ("previous", "deployed", "progress", "expected"),
    [r[1:] for r in ROWS],
    ids=[r[0] for r in ROWS],
)
def test_status_table(
    previous: VersionStatus | None,
    deployed: bool,
    progress: list[SpecProgress],
    expected: VersionStatus,
) -> None:
    assert next_status(previous, deployed=deployed, specs=progress, attempts=3) is expected


REPLACE: list[tuple[str, VersionStatus | None, SpecProgress, int, int]] = [
    # (row, status, spec, attempts, instances that may be created now)
    ("first pass creates the minimum", S.DEPLOYING, SpecProgress(2, 0, 0, 0, 0), 3, 2),
    ("a failure is replaced", S.DEPLOYING, SpecProgress(2, 0, 1, 2, 1), 3, 1),
    ("within the attempts left", S.DEPLOYING, SpecProgress(3, 0, 0, 8, 8), 3, 1),
    ("out of attempts", S.DEPLOYING, SpecProgress(2, 1, 1, 6, 5), 3, 0),
    ("one attempt: no replacement", S.DEPLOYING, SpecProgress(2, 1, 1, 2, 1), 1, 0),
    ("ACTIVE: always replaced", S.DEGRADING, SpecProgress(2, 1, 1, 60, 59), 3, 1),
    ("nothing missing", S.DEPLOYING, SpecProgress(2, 0, 2, 2, 0), 3, 0),
    ("ACTIVE: up to the autoscaler's target", S.ACTIVE, SpecProgress(1, 1, 1, 1, 0, 3), 3, 2),
    ("scaled to zero: nothing missing", S.ACTIVE, SpecProgress(0, 0, 0, 4, 0, 0), 3, 0),
]


@pytest.mark.parametrize(
    ("status", "progress", "attempts", "expected"),
    [r[1:] for r in REPLACE],
    ids=[r[0] for r in REPLACE],
)
def test_replacements(
    status: VersionStatus | None, progress: SpecProgress, attempts: int, expected: int
) -> None:
    assert may_replace(progress, status, attempts) == expected


def test_error_names_why() -> None:
    assert deploy_failed(spec(2, 0, 0, 2, 2), 3) == "all 2 instances tried failed (minimum 2)"
    why = deploy_failed(spec(2, 1, 1, 2, 1), 1)
    assert why is not None and "out of attempts" in why and "1 of 2 Running" in why
    assert deploy_failed(spec(2, 1, 1, 2, 1), 3) is None


def test_active_is_never_claimed_before_every_spec_has_its_minimum() -> None:
    status: VersionStatus | None = None
    status = next_status(status, deployed=True, specs=specs((1, 0), (2, 0)))
    assert status is S.DEPLOYING
    for running in ([1, 0], [1, 1], [0, 2]):
        status = next_status(status, deployed=True, specs=specs((1, running[0]), (2, running[1])))
        assert status is S.DEPLOYING
    assert next_status(status, deployed=True, specs=specs((1, 1), (2, 2))) is S.ACTIVE


def test_degraded_with_some_running_again_is_degrading() -> None:
    assert next_status(S.DEGRADED, deployed=True, specs=specs((3, 1))) is S.DEGRADING


def test_only_active_and_degrading_are_invocable() -> None:
    assert {s for s in S if is_invocable(s)} == {S.ACTIVE, S.DEGRADING}
