"""Function version status: every row of the runtime.md §6 table."""

from __future__ import annotations

import pytest

from service.health import SpecProgress, VersionStatus, is_invocable, next_status

S = VersionStatus


def specs(*pairs: tuple[int, int]) -> list[SpecProgress]:
    return [SpecProgress(min_instances=m, running=r) for m, r in pairs]


ROWS: list[tuple[str, VersionStatus | None, bool, list[SpecProgress], bool, VersionStatus]] = [
    # (row, from, deployed, specs (min, running), an instance failed, to)
    ("created", None, False, [], False, S.INACTIVE),
    ("deployed with some min > 0", S.INACTIVE, True, specs((1, 0), (0, 0)), False, S.DEPLOYING),
    ("deployed with every min = 0", S.INACTIVE, True, specs((0, 0), (0, 0)), False, S.ACTIVE),
    ("still deploying", S.DEPLOYING, True, specs((2, 1)), False, S.DEPLOYING),
    ("every spec reached its minimum", S.DEPLOYING, True, specs((1, 1), (2, 3)), False, S.ACTIVE),
    ("one spec short is not ACTIVE", S.DEPLOYING, True, specs((1, 1), (2, 1)), False, S.DEPLOYING),
    ("an instance fails while deploying", S.DEPLOYING, True, specs((2, 1)), True, S.ERROR),
    ("never scheduled for lack of capacity", S.DEPLOYING, True, specs((1, 0)), True, S.ERROR),
    ("ACTIVE, some but fewer than min", S.ACTIVE, True, specs((2, 1)), False, S.DEGRADING),
    ("ACTIVE, no Running instance", S.ACTIVE, True, specs((2, 0), (1, 0)), False, S.DEGRADED),
    ("DEGRADING, no Running instance", S.DEGRADING, True, specs((2, 0)), False, S.DEGRADED),
    ("DEGRADING back to min", S.DEGRADING, True, specs((2, 2)), False, S.ACTIVE),
    ("DEGRADED back to min", S.DEGRADED, True, specs((1, 1), (1, 2)), False, S.ACTIVE),
    ("ACTIVE stays ACTIVE", S.ACTIVE, True, specs((1, 1)), False, S.ACTIVE),
    ("ACTIVE failure is replaced, not ERROR", S.ACTIVE, True, specs((1, 0)), True, S.DEGRADED),
    ("ERROR stays ERROR while deployed", S.ERROR, True, specs((1, 1)), False, S.ERROR),
    ("ACTIVE deployment deleted", S.ACTIVE, False, [], False, S.INACTIVE),
    ("DEPLOYING deployment deleted", S.DEPLOYING, False, [], False, S.INACTIVE),
    ("ERROR deployment deleted", S.ERROR, False, [], False, S.INACTIVE),
    ("DEGRADED deployment deleted", S.DEGRADED, False, [], False, S.INACTIVE),
    ("DEGRADING deployment deleted", S.DEGRADING, False, [], False, S.INACTIVE),
]


@pytest.mark.parametrize(
    ("previous", "deployed", "progress", "failed", "expected"),
    [r[1:] for r in ROWS],
    ids=[r[0] for r in ROWS],
)
def test_status_table(
    previous: VersionStatus | None,
    deployed: bool,
    progress: list[SpecProgress],
    failed: bool,
    expected: VersionStatus,
) -> None:
    assert (
        next_status(previous, deployed=deployed, specs=progress, instance_failed=failed) is expected
    )


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
