"""The autoscaler's decision as a pure function: table tests over (specifications, load,
memory, policy, now), and the spreading of a total over specifications."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from service.deployments.autoscale.decide import Decision, Load, Memory, SpecView, decide, spread
from service.deployments.autoscale.policy import (
    CUSTOM,
    Details,
    Stickiness,
    custom_policy,
    platform_policy,
    version_policy,
)

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
A, B = uuid.UUID(int=1), uuid.UUID(int=2)
#: no stickiness: a decision on the first reading past a threshold
EAGER = platform_policy(0, 0)


def spec(
    target: int, running: int | None = None, *, lo: int = 0, hi: int = 10, c: int = 1
) -> SpecView:
    return SpecView(A, lo, hi, target, target if running is None else running, c)


def run(
    specs: list[SpecView],
    load: Load | None,
    memory: Memory | None = None,
    *,
    policy: object = EAGER,
    now: datetime = NOW,
    idle: float = 60,
) -> Decision:
    assert policy is not None
    return decide(
        specs,
        load,
        memory or Memory(signal_since=NOW - timedelta(hours=1)),
        policy,  # type: ignore[arg-type]
        now,
        window=30,
        idle=idle,
    )


long_ago = NOW - timedelta(hours=1)


@pytest.mark.parametrize(
    ("specs", "load", "to", "reason"),
    [
        # utilisation = (in flight + waiting) / (running × concurrency)
        ([spec(1)], Load(1, 0, NOW), 2, "scale up"),  # 100 % > 70 %: ⌈1 × 1.2⌉ = 2
        ([spec(10, hi=20)], Load(8, 0, NOW), 12, "scale up"),  # 80 %: ⌈12⌉
        ([spec(5)], Load(3, 0, NOW), 5, ""),  # 60 %: between the thresholds
        ([spec(5)], Load(1, 0, NOW), 4, "scale down"),  # 20 %: ⌊4⌋
        ([spec(2)], Load(0.5, 0, NOW), 1, "scale down"),  # 25 %: ⌊1.6⌋
        ([spec(1)], Load(0, 0, NOW), 1, ""),  # never below 1 but by scale to zero
        ([spec(3, lo=3)], Load(0, 0, NOW), 3, ""),  # never below minInstances
        ([spec(10, hi=10)], Load(20, 5, NOW), 10, ""),  # never above maxInstances
        ([spec(2, c=4)], Load(6, 0, NOW), 3, "scale up"),  # 6 / 8 = 75 %
        ([spec(1)], Load(0, 3, NOW), 2, "scale up"),  # the queue counts as load
        ([spec(0)], Load(0, 1, NOW), 1, "scale from zero: a request waits and no instance runs"),
        ([spec(0, hi=0)], Load(0, 1, NOW), 0, ""),  # maxInstances 0: nothing to start
        # the previous step is not Running yet: no further step up
        ([spec(3, running=2)], Load(2, 4, NOW), 3, ""),
    ],
)
def test_one_reading(specs: list[SpecView], load: Load, to: int, reason: str) -> None:
    decision = run(specs, load)
    assert decision.total_to == to
    assert decision.reason == reason
    assert decision.changed == (to != decision.total_from)


def test_missing_signal_is_never_zero_load() -> None:
    """No replica reported: hold whatever the idle time, and forget when the signal began."""
    memory = Memory(last_request_at=long_ago, signal_since=long_ago)
    decision = run([spec(2)], None, memory, idle=0)
    assert not decision.changed and decision.total_to == 2
    assert decision.memory.signal_since is None
    # the signal returns: the idle period starts again from now
    back = run([spec(1)], Load(0, 0, None), decision.memory, idle=60)
    assert not back.changed and back.memory.signal_since == NOW
    later = run([spec(1)], Load(0, 0, None), back.memory, now=NOW + timedelta(seconds=61))
    assert later.total_to == 0 and later.reason.startswith("scale to zero")


@pytest.mark.parametrize(
    ("load", "memory", "to"),
    [
        (Load(0, 0, long_ago), Memory(signal_since=long_ago), 0),  # idle for an hour
        (Load(0, 0, NOW - timedelta(seconds=30)), Memory(signal_since=long_ago), 1),  # recent
        (Load(0, 0, None), Memory(signal_since=NOW - timedelta(seconds=10)), 1),  # new signal
        (Load(0.5, 0, long_ago), Memory(signal_since=long_ago), 1),  # something in flight
        # a request the memory saw counts even when no replica reports it any more
        (Load(0, 0, None), Memory(last_request_at=NOW, signal_since=long_ago), 1),
    ],
)
def test_scale_to_zero(load: Load, memory: Memory, to: int) -> None:
    decision = run([spec(1)], load, memory)
    assert decision.total_to == to


def test_scale_to_zero_only_when_every_minimum_is_zero() -> None:
    """A specification with minInstances 1 keeps the version above zero: idle is then an
    ordinary scale down to the minimum."""
    specs = [spec(1), SpecView(B, 1, 4, 1, 1, 1)]
    decision = run(specs, Load(0, 0, long_ago))
    assert decision.reason == "scale down"
    assert decision.targets == {A: 0, B: 1}
    assert not run([SpecView(B, 1, 4, 1, 1, 1)], Load(0, 0, long_ago)).changed


def test_stickiness_needs_the_threshold_time_past_the_threshold() -> None:
    """Up stickiness 20 s: one hot reading is not enough; 20 s of hot readings are."""
    policy = replace(EAGER, up=replace(EAGER.up, stickiness=Stickiness(60, 20)))
    memory = Memory(signal_since=long_ago)
    for seconds in range(0, 20, 5):
        decision = run([spec(2)], Load(2, 0, NOW), memory, policy=policy, now=NOW + _s(seconds))
        assert not decision.changed, seconds
        memory = decision.memory
    decision = run([spec(2)], Load(2, 0, NOW), memory, policy=policy, now=NOW + _s(20))
    assert decision.total_to == 3
    assert decision.memory.samples == ()  # the window restarts after a decision


def test_a_cool_reading_inside_the_window_delays_the_decision() -> None:
    policy = replace(EAGER, up=replace(EAGER.up, stickiness=Stickiness(60, 20)))
    memory = Memory(signal_since=long_ago)
    for seconds, in_flight in [(0, 2), (5, 2), (10, 0.2), (15, 2), (20, 2)]:
        decision = run(
            [spec(2)], Load(in_flight, 0, NOW), memory, policy=policy, now=NOW + _s(seconds)
        )
        memory = decision.memory
    assert not decision.changed  # 15 s past 70 % of 20 needed
    decision = run([spec(2)], Load(2, 0, NOW), memory, policy=policy, now=NOW + _s(25))
    assert decision.changed


def test_constant_load_settles_without_flapping() -> None:
    """8 clients on instances of concurrency 1, from 1 instance: the count rises step by step
    to 12 (8 / 12 = 67 %) and then never moves again."""
    memory = Memory(signal_since=long_ago)
    total, changes = 1, []
    for step in range(100):
        decision = run([spec(total, hi=20)], Load(8, 0, NOW), memory, now=NOW + _s(step))
        memory = decision.memory
        if decision.changed:
            changes.append(decision.total_to)
            total = decision.total_to
    assert changes == [2, 3, 4, 5, 6, 8, 10, 12]
    assert 0.3 < 8 / total < 0.7


def test_custom_policy_changes_the_thresholds() -> None:
    custom = custom_policy(
        {"scaleUpDetails": {"factor": 2.0, "threshold": 50}}, platform_policy(0, 0)
    )
    assert custom.name == CUSTOM and custom.down == platform_policy(0, 0).down
    # 60 %: nothing with the platform policy, ×2 with the custom one
    assert not run([spec(5)], Load(3, 0, NOW)).changed
    assert run([spec(5)], Load(3, 0, NOW), policy=custom).total_to == 10


def test_the_first_custom_specification_sets_the_version_policy() -> None:
    platform = platform_policy()
    config = {"scaleDownDetails": {"factor": 0.5, "threshold": 10, "metric": "m"}}
    picked = version_policy([(None, None), (CUSTOM, config)], platform)
    assert picked.down == Details(0.5, 10, platform.down.stickiness, "m")
    assert version_policy([("PLATFORM_CONFIGURATION", None)], platform) == platform


@pytest.mark.parametrize(
    ("specs", "total", "expected"),
    [
        # up: to the one with the fewest, preferred first
        ([(0, 0, 4, (1, 0)), (0, 0, 4, (1, 1))], 3, (2, 1)),
        ([(0, 0, 4, (2, 0)), (0, 0, 4, (1, 1))], 1, (0, 1)),
        # within each one's bounds
        ([(0, 0, 1, (1, 0)), (0, 0, 4, (1, 1))], 4, (1, 3)),
        # down: from the one with the most, never below its minimum
        ([(3, 2, 4, (1, 0)), (1, 0, 4, (1, 1))], 2, (2, 0)),
        # clamped to what the bounds allow
        ([(1, 1, 2, (1, 0)), (1, 1, 2, (1, 1))], 9, (2, 2)),
        ([(1, 1, 2, (1, 0)), (1, 1, 2, (1, 1))], 0, (1, 1)),
    ],
)
def test_spread(
    specs: list[tuple[int, int, int, tuple[int, int]]], total: int, expected: tuple[int, int]
) -> None:
    views = [
        SpecView(uuid.UUID(int=i + 1), lo, hi, target, 0, 1, order)
        for i, (target, lo, hi, order) in enumerate(specs)
    ]
    got = spread(views, total)
    assert (got[views[0].spec_id], got[views[1].spec_id]) == expected


def test_memory_round_trips_as_json() -> None:
    memory = Memory(((1.5, 0.25),), NOW, long_ago)
    assert Memory.from_json(memory.to_json()) == memory
    assert Memory.from_json(None) == Memory()
    assert Memory.from_json({"samples": [[1, 2, 3], "x"], "lastRequestAt": "nope"}) == Memory()


def _s(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)
