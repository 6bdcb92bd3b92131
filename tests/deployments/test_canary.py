"""A canary release's plan (every violation named) and its pure decision: a failing canary
rolled back at its first step, a healthy one promoted through every step, a slow one rolled
back, a step held while the canary has no Running instance or too few requests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from service.core.validation import parse
from service.deployments.canary import Figures, Phase, PlanIn, State, decide

T0 = datetime(2026, 12, 7, tzinfo=UTC)
PLAN, _ = parse(
    PlanIn,
    {
        "steps": [{"weight": 10, "seconds": 60}, {"weight": 50, "requests": 500}],
        "analysis": {"maxErrorRateIncrease": 0.02, "maxLatencyRatio": 1.5, "minRequests": 100},
    },
)
STABLE = Figures(requests=1000, errors=5, p95_seconds=0.2)
START = State(Phase.RUNNING, 0, T0)


def plan() -> PlanIn:
    assert PLAN is not None
    return PLAN


def test_a_canary_failing_20_percent_is_rolled_back_at_its_first_step_saying_why() -> None:
    failing = Figures(requests=120, errors=24, p95_seconds=0.2)
    decision = decide(plan(), START, failing, STABLE, running=True, now=T0 + timedelta(seconds=5))
    assert decision.state.phase is Phase.ROLLED_BACK
    assert decision.weight == 0
    assert decision.reason is not None
    assert "step 1" in decision.reason and "20.00%" in decision.reason
    # and it stays rolled back
    later = decide(plan(), decision.state, failing, STABLE, running=True, now=T0 + timedelta(1))
    assert (later.state, later.weight, later.reason) == (decision.state, 0, None)


def test_a_healthy_canary_is_promoted_through_every_step() -> None:
    healthy = Figures(requests=150, errors=1, p95_seconds=0.21)
    held = decide(plan(), START, healthy, STABLE, running=True, now=T0 + timedelta(seconds=30))
    assert (held.state, held.weight, held.reason) == (START, 10, None)
    second = decide(plan(), START, healthy, STABLE, running=True, now=T0 + timedelta(seconds=60))
    assert (second.state.phase, second.state.step, second.weight) == (Phase.RUNNING, 1, 50)
    assert second.reason is not None and "step 1 passed" in second.reason
    busy = Figures(requests=500, errors=3, p95_seconds=0.2)
    last = decide(plan(), second.state, busy, STABLE, running=True, now=T0 + timedelta(seconds=61))
    assert (last.state.phase, last.weight) == (Phase.PROMOTED, 100)
    assert last.reason is not None and "promoted" in last.reason


def test_a_slow_canary_is_rolled_back() -> None:
    slow = Figures(requests=200, errors=0, p95_seconds=0.31)
    decision = decide(plan(), START, slow, STABLE, running=True, now=T0 + timedelta(seconds=1))
    assert (decision.state.phase, decision.weight) == (Phase.ROLLED_BACK, 0)
    assert decision.reason is not None and "p95 latency 0.310s" in decision.reason


def test_a_step_waits_for_a_running_instance_and_enough_requests() -> None:
    healthy = Figures(requests=150, errors=0, p95_seconds=0.2)
    after = T0 + timedelta(minutes=5)
    assert decide(plan(), START, healthy, STABLE, running=False, now=after).state == START
    few = Figures(requests=99, errors=50, p95_seconds=9.0)
    assert decide(plan(), START, few, STABLE, running=True, now=after).state == START
    paused = State(Phase.PAUSED, 0, T0)
    decision = decide(plan(), paused, healthy, STABLE, running=True, now=after)
    assert (decision.state, decision.weight) == (paused, 10)


def fields(body: dict[str, Any]) -> list[str]:
    model, errors = parse(PlanIn, body)
    assert model is None
    return [e.field for e in errors]


def test_a_bad_plan_names_each_violation() -> None:
    assert fields({"steps": []}) == ["steps"]
    assert fields(
        {
            "steps": [{"weight": 0, "seconds": 10}, {"weight": 20}],
            "analysis": {"maxErrorRateIncrease": 2, "maxLatencyRatio": 0.5, "minRequests": 0},
        }
    ) == [
        "steps[0].weight",
        "steps[1]",
        "analysis.maxErrorRateIncrease",
        "analysis.maxLatencyRatio",
        "analysis.minRequests",
    ]
    assert fields({"steps": [{"weight": 50, "seconds": 1}, {"weight": 40, "seconds": 1}]}) == [
        "steps[1].weight"
    ]
