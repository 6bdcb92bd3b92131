"""NVCF's `autoscalingConfiguration` and `autoscalingConfigurationPolicy` as request and
response shapes (PATCH/PUT of a GPU specification), declared once with their limits.

As NVCF checks them: a scale-up factor above 1, a scale-down factor below 1 (above 0), a
threshold from 0 to 100 (percent), a stickiness of ISO-8601 durations `size` ≤ PT1H and
`threshold` < `size`; here also at most 10 for a factor and, when both sides are given, a
scale-up threshold above the scale-down one (the instance count would flap otherwise).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from service.core.durations import DurationError, parse_timedelta
from service.core.http import json_kind
from service.core.schemas import CamelModel
from service.core.validation import Check, RequestModel, raise_all
from service.deployments.autoscale.policy import CUSTOM, PLATFORM

MAX_FACTOR = 10.0
MAX_STICKINESS = timedelta(hours=1)
MAX_METRIC = 64


def _duration(value: Any) -> str | None:
    try:
        parse_timedelta(value)
    except DurationError:
        return f"must be an ISO-8601 duration such as PT5M, got {_shown(value)}"
    return None


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, str) else json_kind(value)


def _number(value: Any) -> None:
    if value is None:
        raise PydanticCustomError("rule", "is required: a number")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PydanticCustomError("rule", f"must be a number, got {json_kind(value)}")


def _up_factor(value: Any) -> str | None:
    _number(value)
    if not 1 < value <= MAX_FACTOR:
        return f"must be a number above 1 and at most {MAX_FACTOR:g}, got {value}"
    return None


def _down_factor(value: Any) -> str | None:
    _number(value)
    if not 0 < value < 1:
        return f"must be a number above 0 and below 1, got {value}"
    return None


def _threshold(value: Any) -> str | None:
    if value is None:
        return "is required: an integer from 0 to 100 (percent of utilisation)"
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 100:
        return f"must be an integer from 0 to 100 (percent of utilisation), got {_shown(value)}"
    return None


def _metric(value: Any) -> str | None:
    if value is None or (isinstance(value, str) and 0 < len(value) <= MAX_METRIC):
        return None
    return f"must be a metric name of 1 to {MAX_METRIC} characters, got {_shown(value)}"


def _policy(value: Any) -> str | None:
    if value is None or value in (CUSTOM, PLATFORM):
        return None
    return f"must be {CUSTOM} or {PLATFORM}, got {_shown(value)}"


class StickinessIn(RequestModel):
    shape: ClassVar[str] = "{size, threshold} (ISO-8601 durations)"
    null_when_missing: ClassVar[tuple[str, ...]] = ("size", "threshold")

    size: Annotated[
        str, Check(_duration, {"format": "duration", "examples": ["PT10M"]}, before=True)
    ] = Field(description="the sliding window, at most PT1H")
    threshold: Annotated[
        str, Check(_duration, {"format": "duration", "examples": ["PT3M"]}, before=True)
    ] = Field(description="time past the scaling threshold within the window, below `size`")

    @model_validator(mode="after")
    def _bounds(self) -> StickinessIn:
        size, threshold = parse_timedelta(self.size), parse_timedelta(self.threshold)
        problems: list[tuple[str, str]] = []
        if size > MAX_STICKINESS:
            problems.append(("size", f"must be at most PT1H, got {self.size}"))
        if threshold >= size:
            problems.append(("threshold", f"must be shorter than size ({self.size})"))
        if problems:
            raise_all(problems)
        return self

    def seconds(self) -> tuple[float, float]:
        return (
            parse_timedelta(self.size).total_seconds(),
            parse_timedelta(self.threshold).total_seconds(),
        )


class _DetailsIn(RequestModel):
    shape: ClassVar[str] = "{metric?, factor, threshold, stickiness?}"
    null_when_missing: ClassVar[tuple[str, ...]] = ("factor", "threshold")

    metric: Annotated[str | None, Check(_metric, {"maxLength": MAX_METRIC}, before=True)] = None
    factor: float
    threshold: Annotated[int, Check(_threshold, {"minimum": 0, "maximum": 100}, before=True)]
    stickiness: StickinessIn | None = None

    def stored(self) -> dict[str, Any]:
        out: dict[str, Any] = {"factor": self.factor, "threshold": self.threshold}
        if self.metric is not None:
            out["metric"] = self.metric
        if self.stickiness is not None:
            out["stickiness"] = {
                "size": self.stickiness.size,
                "threshold": self.stickiness.threshold,
            }
        return out


class ScaleUpDetailsIn(_DetailsIn):
    factor: Annotated[
        float,
        Check(_up_factor, {"exclusiveMinimum": 1, "maximum": MAX_FACTOR}, before=True),
    ] = Field(description="the instance count is multiplied by it (rounded up), above 1")


class ScaleDownDetailsIn(_DetailsIn):
    factor: Annotated[
        float, Check(_down_factor, {"exclusiveMinimum": 0, "exclusiveMaximum": 1}, before=True)
    ] = Field(description="the instance count is multiplied by it (rounded down), below 1")


class AutoscalingConfigurationIn(RequestModel):
    """NVCF's `autoscalingConfiguration`: a side not given keeps the platform's."""

    shape: ClassVar[str] = "{scaleUpDetails?, scaleDownDetails?}"

    scale_up_details: ScaleUpDetailsIn | None = None
    scale_down_details: ScaleDownDetailsIn | None = None

    @model_validator(mode="after")
    def _apart(self) -> AutoscalingConfigurationIn:
        up, down = self.scale_up_details, self.scale_down_details
        if up is not None and down is not None and up.threshold <= down.threshold:
            raise_all(
                [
                    (
                        "scaleUpDetails",
                        f"threshold ({up.threshold}) must be above the scaleDownDetails "
                        f"threshold ({down.threshold})",
                    )
                ]
            )
        return self

    def stored(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.scale_up_details is not None:
            out["scaleUpDetails"] = self.scale_up_details.stored()
        if self.scale_down_details is not None:
            out["scaleDownDetails"] = self.scale_down_details.stored()
        return out


PolicyName = Annotated[
    Literal["CUSTOM_CONFIGURATION", "PLATFORM_CONFIGURATION"] | None,
    Check(_policy, before=True),
]


# --- as shown ----------------------------------------------------------------------------------


class StickinessOut(CamelModel):
    size: str
    threshold: str


class ScalingDetailsOut(CamelModel):
    metric: str | None = None
    factor: float
    threshold: int
    stickiness: StickinessOut | None = None


class AutoscalingConfigurationOut(CamelModel):
    scale_up_details: ScalingDetailsOut | None = None
    scale_down_details: ScalingDetailsOut | None = None


__all__ = [
    "AutoscalingConfigurationIn",
    "AutoscalingConfigurationOut",
    "PolicyName",
    "ScaleDownDetailsIn",
    "ScaleUpDetailsIn",
    "StickinessIn",
]
