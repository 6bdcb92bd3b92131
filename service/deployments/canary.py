"""A canary release's plan and its one decision (docs/rollouts.md, "Canary releases").

`decide` is pure: from the plan, the release's state, what the engine measured of the canary
and of the stable version over the step's window, whether the canary has a Running instance,
and the time, it says what the release does next and why (the figures that decided are in the
`Decision`). The state is written by transitions/canary.py, decided by canary_loop.py on the
figures of canary_figures.py, and operated through releases.py (the API).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Annotated, ClassVar

from pydantic import Field, StrictInt, model_validator

from service.core.validation import MaxItems, RequestModel, int_between, raise_all

#: steps in one plan, at most
MAX_STEPS = 20
#: a step lasts at most a week, or at most this many requests
MAX_STEP_SECONDS = 7 * 24 * 3600
MAX_STEP_REQUESTS = 10_000_000


class StepIn(RequestModel):
    """One step: the canary's weight, held for `seconds` or until `requests` reached it."""

    weight: Annotated[StrictInt, int_between(1, 100)]
    seconds: Annotated[StrictInt, int_between(1, MAX_STEP_SECONDS)] | None = None
    requests: Annotated[StrictInt, int_between(1, MAX_STEP_REQUESTS)] | None = None

    shape: ClassVar[str] = "with weight and seconds or requests"

    @model_validator(mode="after")
    def _one_end(self) -> StepIn:
        if (self.seconds is None) == (self.requests is None):
            raise_all([("", "needs exactly one of seconds and requests")])
        return self


class AnalysisIn(RequestModel):
    """The canary fails a step when its error rate exceeds the stable version's by more than
    `maxErrorRateIncrease` (a fraction), or its p95 latency the stable version's times
    `maxLatencyRatio`, over at least `minRequests` requests of the step."""

    max_error_rate_increase: Annotated[float, Field(ge=0.0, le=1.0)] = 0.01
    max_latency_ratio: Annotated[float, Field(ge=1.0, le=100.0)] = 1.2
    min_requests: Annotated[StrictInt, int_between(1, MAX_STEP_REQUESTS)] = 100


class PlanIn(RequestModel):
    """A canary release's plan: its steps, with weights that grow, and its analysis."""

    steps: Annotated[list[StepIn], Field(min_length=1), MaxItems(MAX_STEPS)]
    analysis: AnalysisIn = Field(default_factory=AnalysisIn)

    @model_validator(mode="after")
    def _growing(self) -> PlanIn:
        pairs = zip(self.steps, self.steps[1:], strict=False)
        shrinking = [
            (f"steps[{i}].weight", f"must be above the previous step's {prev.weight}")
            for i, (prev, step) in enumerate(pairs, 1)
            if step.weight <= prev.weight
        ]
        if shrinking:
            raise_all(shrinking)
        return self


class Phase(StrEnum):
    RUNNING = "RUNNING"
    PAUSED = "PAUSED"
    PROMOTED = "PROMOTED"
    ROLLED_BACK = "ROLLED_BACK"
    ABORTED = "ABORTED"


@dataclass(frozen=True)
class State:
    phase: Phase
    step: int
    step_started_at: datetime


@dataclass(frozen=True)
class Figures:
    """What the engine measured of one version over the step's window."""

    requests: int
    errors: int
    p95_seconds: float

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


@dataclass(frozen=True)
class Decision:
    state: State
    #: the canary's weight from now on
    weight: int
    #: why, with the figures (an event of the function's timeline); None: nothing changed
    reason: str | None


def _failure(plan: PlanIn, canary: Figures, stable: Figures) -> str | None:
    a = plan.analysis
    if canary.error_rate > stable.error_rate + a.max_error_rate_increase:
        return (
            f"error rate {canary.error_rate:.2%} over {canary.requests} requests against the "
            f"stable version's {stable.error_rate:.2%} (at most "
            f"{a.max_error_rate_increase:.2%} more)"
        )
    if stable.requests and canary.p95_seconds > stable.p95_seconds * a.max_latency_ratio:
        return (
            f"p95 latency {canary.p95_seconds:.3f}s against the stable version's "
            f"{stable.p95_seconds:.3f}s (at most {a.max_latency_ratio}×)"
        )
    return None


def decide(
    plan: PlanIn,
    state: State,
    canary: Figures,
    stable: Figures,
    *,
    running: bool,
    now: datetime,
) -> Decision:
    """What the release does next (see the module docstring)."""
    steps = plan.steps
    if state.phase is not Phase.RUNNING:
        weight = {Phase.PROMOTED: 100, Phase.PAUSED: steps[state.step].weight}.get(state.phase, 0)
        return Decision(state, weight, None)
    step = steps[state.step]
    if canary.requests >= plan.analysis.min_requests:
        failed = _failure(plan, canary, stable)
        if failed is not None:
            rolled = dataclasses.replace(state, phase=Phase.ROLLED_BACK, step_started_at=now)
            return Decision(rolled, 0, f"step {state.step + 1} failed its analysis: {failed}")
    ended = (
        step.seconds is not None and now - state.step_started_at >= timedelta(seconds=step.seconds)
    ) or (step.requests is not None and canary.requests >= step.requests)
    if not ended or not running or canary.requests < plan.analysis.min_requests:
        return Decision(state, step.weight, None)
    figures = (
        f"error rate {canary.error_rate:.2%} (stable {stable.error_rate:.2%}), p95 "
        f"{canary.p95_seconds:.3f}s (stable {stable.p95_seconds:.3f}s) over "
        f"{canary.requests} requests"
    )
    if state.step + 1 == len(steps):
        promoted = State(Phase.PROMOTED, state.step, now)
        return Decision(promoted, 100, f"step {state.step + 1} passed, promoted: {figures}")
    following = State(Phase.RUNNING, state.step + 1, now)
    return Decision(
        following,
        steps[state.step + 1].weight,
        f"step {state.step + 1} passed, weight {steps[state.step + 1].weight}%: {figures}",
    )
