"""The rollout and drain decisions (service/deployments/rollout.py), as tables."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from service.deployments.rollout import Decision, Member, decide, drained

T0 = datetime(2026, 1, 1, tzinfo=UTC)
IDS = [uuid.UUID(int=i) for i in range(1, 10)]


def m(i: int, revision: int, running: bool = True) -> Member:
    return Member(IDS[i], revision, running, T0 + timedelta(seconds=i))


@pytest.mark.parametrize(
    ("desired", "target", "members", "rolling", "expected"),
    [
        # no rollout: converge the count
        (2, 1, [], False, Decision(create=2)),
        (2, 1, [m(0, 1)], False, Decision(create=1)),
        (2, 1, [m(0, 1), m(1, 1)], False, Decision()),
        # scale down: not serving first, then the oldest
        (
            1,
            1,
            [m(0, 1), m(1, 1, running=False), m(2, 1)],
            False,
            Decision(retire=(IDS[1], IDS[0])),
        ),
        # rollout of one instance: surge one on the target revision …
        (1, 2, [m(0, 1)], True, Decision(create=1, rolling=True)),
        # … wait while it starts …
        (1, 2, [m(0, 1), m(1, 2, running=False)], True, Decision(waiting=True, rolling=True)),
        # … then retire the old one once the new one is Running …
        (1, 2, [m(0, 1), m(1, 2)], True, Decision(retire=(IDS[0],), rolling=True)),
        # … and complete when every instance runs the target
        (1, 2, [m(1, 2)], True, Decision(completed=True)),
        # not complete while a target instance still starts
        (1, 2, [m(1, 2, running=False)], True, Decision(rolling=True)),
        # three instances: one at a time, oldest old first
        (3, 2, [m(0, 1), m(1, 1), m(2, 1)], True, Decision(create=1, rolling=True)),
        (
            3,
            2,
            [m(0, 1), m(1, 1), m(2, 1), m(3, 2)],
            True,
            Decision(retire=(IDS[0],), rolling=True),
        ),
        (3, 2, [m(1, 1), m(2, 1), m(3, 2)], True, Decision(create=1, rolling=True)),
        # an old instance that is not Running serves nobody: retired at once
        (2, 2, [m(0, 1, running=False), m(1, 1)], True, Decision(retire=(IDS[0],), rolling=True)),
        # scale to zero during a rollout: old ones go one at a time
        (0, 2, [m(0, 1), m(1, 1)], True, Decision(retire=(IDS[0],), rolling=True)),
        # a rollback is a rollout to an earlier revision
        (1, 1, [m(0, 2)], True, Decision(create=1, rolling=True)),
    ],
)
def test_decide(
    desired: int, target: int, members: list[Member], rolling: bool, expected: Decision
) -> None:
    assert decide(desired, target, members, rolling=rolling) == expected


S = T0


@pytest.mark.parametrize(
    ("now", "in_flight", "waiting", "expected"),
    [
        (S, 0, 0, False),  # idle, but routes may still hold it: grace first
        (S + timedelta(seconds=1), 0, 0, True),  # idle after the grace
        (S + timedelta(seconds=5), 2, 0, False),  # requests in flight: keep it
        (S + timedelta(seconds=5), 0, 3, False),  # requests queued (graceful undeploy)
        (S + timedelta(seconds=30), 2, 3, True),  # the drain timeout ends it anyway
        (S + timedelta(seconds=5), None, 0, False),  # unknown: only the timeout ends it
        (S + timedelta(seconds=30), None, 0, True),
    ],
)
def test_drained(now: datetime, in_flight: int | None, waiting: int, expected: bool) -> None:
    got = drained(since=S, now=now, timeout=30, grace=1, in_flight=in_flight, waiting=waiting)
    assert got is expected
