"""Instance health: the observed-state model, the pure health state machine, version status."""

from service.health.conditions import backend_error, failed, previous_condition
from service.health.machine import (
    HealthMode,
    HealthTimeouts,
    InstanceCondition,
    Observation,
    Phase,
    evaluate,
)
from service.health.observed import (
    Condition,
    ContainerState,
    ContainerStatus,
    Controller,
    Event,
    ObjectRef,
    ObservedState,
    Pod,
)
from service.health.status import SpecProgress, VersionStatus, is_invocable, next_status

__all__ = [
    "Condition",
    "ContainerState",
    "ContainerStatus",
    "Controller",
    "Event",
    "HealthMode",
    "HealthTimeouts",
    "InstanceCondition",
    "ObjectRef",
    "Observation",
    "ObservedState",
    "Phase",
    "Pod",
    "SpecProgress",
    "VersionStatus",
    "backend_error",
    "evaluate",
    "failed",
    "is_invocable",
    "next_status",
    "previous_condition",
]
