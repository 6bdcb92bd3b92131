"""A traffic split's pick (`Split.pick`): requests spread by the weights, and a session's
calls stay on one version."""

from __future__ import annotations

import dataclasses
import random
import uuid
from collections import Counter

from service.invocation.routing import Split
from tests.support.invocation import route, target

STABLE = target(route(1))
CANARY = dataclasses.replace(STABLE, version_id=uuid.UUID(int=201))


def test_ten_thousand_requests_over_a_90_10_split_land_90_percent_on_the_stable_version() -> None:
    split = Split.of([CANARY, STABLE], [10, 90])
    ids = random.Random(46)
    landed = Counter(
        split.pick(str(uuid.UUID(int=ids.getrandbits(128), version=4))).version_id
        for _ in range(10_000)
    )
    assert 8_900 <= landed[STABLE.version_id] <= 9_100
    assert landed[STABLE.version_id] + landed[CANARY.version_id] == 10_000


def test_a_session_stays_on_its_version_and_a_zero_weight_takes_nothing() -> None:
    split = Split.of([CANARY, STABLE], [50, 50])
    sessions = [f"session-{n}" for n in range(200)]
    first = {s: split.pick(s).version_id for s in sessions}
    assert all(split.pick(s).version_id == first[s] for s in sessions for _ in range(3))
    assert set(first.values()) == {STABLE.version_id, CANARY.version_id}
    # the canary's share growing: its sessions stay on it
    grown = Split.of([CANARY, STABLE], [80, 20])
    assert all(
        grown.pick(s).version_id == CANARY.version_id
        for s in sessions
        if first[s] == CANARY.version_id
    )
    none = Split.of([CANARY, STABLE], [0, 100])
    assert {none.pick(s).version_id for s in sessions} == {STABLE.version_id}
