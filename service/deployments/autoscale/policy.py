"""Scaling policies: NVCF's platform configuration and a specification's custom one.

A policy is a pair of `Details` (scale up, scale down): the factor the instance count is
multiplied by, the utilisation threshold (percent) past which it applies, and the stickiness
(`threshold` seconds past the threshold within a `size`-second window before it applies).
The platform policy is NVCF's: ×1.2 (rounded up) above 70 %, ×0.8 (rounded down) below 30 %,
its stickiness from the settings. A custom configuration (`autoscalingConfiguration` of
`CUSTOM_CONFIGURATION`) replaces the side(s) it gives; the other keeps the platform's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from service.core.durations import DurationError, parse_timedelta
from service.core.settings import Settings

PLATFORM = "PLATFORM_CONFIGURATION"
CUSTOM = "CUSTOM_CONFIGURATION"
POLICIES = (CUSTOM, PLATFORM)

#: NVCF's platform configuration
PLATFORM_UP_FACTOR = 1.2
PLATFORM_UP_THRESHOLD = 70
PLATFORM_DOWN_FACTOR = 0.8
PLATFORM_DOWN_THRESHOLD = 30

_DEFAULTS = Settings.model_construct()


@dataclass(frozen=True)
class Stickiness:
    """`threshold` seconds past the scaling threshold within the last `size` seconds."""

    size: float
    threshold: float


@dataclass(frozen=True)
class Details:
    factor: float
    #: utilisation, percent
    threshold: int
    stickiness: Stickiness
    metric: str | None = None


@dataclass(frozen=True)
class Policy:
    up: Details
    down: Details
    #: CUSTOM_CONFIGURATION or PLATFORM_CONFIGURATION
    name: str = PLATFORM

    def describe(self) -> str:
        return (
            f"×{self.up.factor:g} above {self.up.threshold} %, "
            f"×{self.down.factor:g} below {self.down.threshold} %"
        )


def platform_policy(
    up_stickiness: float = _DEFAULTS.autoscale_up_stickiness_seconds,
    down_stickiness: float = _DEFAULTS.autoscale_down_stickiness_seconds,
) -> Policy:
    """NVCF's platform configuration, with the stickiness of the settings (window: twice)."""
    return Policy(
        up=Details(
            PLATFORM_UP_FACTOR, PLATFORM_UP_THRESHOLD, Stickiness(2 * up_stickiness, up_stickiness)
        ),
        down=Details(
            PLATFORM_DOWN_FACTOR,
            PLATFORM_DOWN_THRESHOLD,
            Stickiness(2 * down_stickiness, down_stickiness),
        ),
    )


def platform_from_settings(settings: Settings) -> Policy:
    return platform_policy(
        settings.autoscale_up_stickiness_seconds, settings.autoscale_down_stickiness_seconds
    )


def _seconds(text: Any) -> float:
    try:
        return parse_timedelta(text).total_seconds()
    except DurationError:
        return 0.0


def _details(stored: Mapping[str, Any], default: Details) -> Details:
    stick = stored.get("stickiness")
    stickiness = (
        Stickiness(_seconds(stick.get("size")), _seconds(stick.get("threshold")))
        if isinstance(stick, Mapping)
        else default.stickiness
    )
    return Details(
        factor=float(stored.get("factor", default.factor)),
        threshold=int(stored.get("threshold", default.threshold)),
        stickiness=stickiness,
        metric=stored.get("metric") if isinstance(stored.get("metric"), str) else None,
    )


def custom_policy(configuration: Mapping[str, Any] | None, platform: Policy) -> Policy:
    """A stored custom configuration over the platform policy (a side not given keeps the
    platform's)."""
    config = configuration or {}
    up, down = config.get("scaleUpDetails"), config.get("scaleDownDetails")
    return replace(
        platform,
        up=_details(up, platform.up) if isinstance(up, Mapping) else platform.up,
        down=_details(down, platform.down) if isinstance(down, Mapping) else platform.down,
        name=CUSTOM,
    )


def version_policy(
    specs: Iterable[tuple[str | None, Mapping[str, Any] | None]], platform: Policy
) -> Policy:
    """The policy of a function version: NVCF decides per version, so the first specification
    (in the order given) with a custom configuration sets it; otherwise the platform's."""
    for name, configuration in specs:
        if name == CUSTOM and configuration is not None:
            return custom_policy(configuration, platform)
    return platform


__all__ = [
    "CUSTOM",
    "PLATFORM",
    "POLICIES",
    "Details",
    "Policy",
    "Stickiness",
    "custom_policy",
    "platform_from_settings",
    "platform_policy",
    "version_policy",
]
