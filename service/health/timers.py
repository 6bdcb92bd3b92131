"""The timers of one evaluation of the state machine (runtime.md §5): how long each check may
last (`HealthTimeouts`, the `NVCF_HEALTH_*` settings), what an evaluation keeps and finds (`Run`:
timers carried across evaluations, deadlines, issues) and the `Failure` that ends it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from service.core.settings import Settings
from service.health.conditions import InstanceCondition, Observation, Phase

#: the settings' defaults, read once: each default is written in service/core/settings.py only
_DEFAULTS = Settings.model_construct()


@dataclass(frozen=True)
class HealthTimeouts:
    """Seconds for each timeout of runtime.md §5 (defaults: the `NVCF_HEALTH_*` settings)."""

    pod_scheduling: float = _DEFAULTS.health_pod_scheduling_timeout
    image_pull: float = _DEFAULTS.health_image_pull_timeout
    restart_loop: float = _DEFAULTS.health_restart_loop_timeout
    init: float = _DEFAULTS.health_init_timeout
    worker_startup: float = _DEFAULTS.health_worker_startup_timeout
    worker_degradation: float = _DEFAULTS.health_worker_degradation_period
    pending: float = _DEFAULTS.health_pending_timeout
    failing_backoff: float = _DEFAULTS.health_failing_backoff
    #: how often a failing object is looked at again during its backoff (not a setting)
    failing_recheck: float = 30.0

    @classmethod
    def from_settings(cls, settings: Settings) -> HealthTimeouts:
        return cls(
            pod_scheduling=settings.health_pod_scheduling_timeout,
            image_pull=settings.health_image_pull_timeout,
            restart_loop=settings.health_restart_loop_timeout,
            init=settings.health_init_timeout,
            worker_startup=settings.health_worker_startup_timeout,
            worker_degradation=settings.health_worker_degradation_period,
            pending=settings.health_pending_timeout,
            failing_backoff=settings.health_failing_backoff,
            failing_recheck=min(30.0, settings.health_failing_backoff),
        )


def human_duration(seconds: float) -> str:
    """`90s`, `10m`, `1h 30m`, `0.5s` — for messages."""
    if seconds < 60:
        return f"{seconds:.3g}s"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{hours}h" if hours else "", f"{minutes}m" if minutes else ""]
    if not hours and secs:
        parts.append(f"{secs}s")
    return " ".join(p for p in parts if p)


class Failure(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class Run:
    """Bookkeeping of one evaluation: timers touched, deadlines, issues found."""

    def __init__(
        self, previous: InstanceCondition | None, now: datetime, timeouts: HealthTimeouts
    ) -> None:
        self.previous = previous
        self.now = now
        self.t = timeouts
        self.prev_timers: Mapping[str, datetime] = previous.timers if previous else {}
        self.timers: dict[str, datetime] = {}
        self.deadlines: list[datetime] = []
        self.issues: list[Observation] = []  # what keeps the instance from Running
        self.notes: list[Observation] = []  # informational only (worker-readiness mode)

    def expired(self, key: str, timeout: float, start: datetime | None = None) -> bool:
        """Keep (or start) timer `key`; True once `timeout` seconds have elapsed since it began.

        `start` is when the cluster says the condition began (a pod's launch, when its Ready
        condition went False): that clock is NVCF's, so it wins. Without one, the clock starts
        at the first evaluation that sees the condition and is carried in the condition's
        timers. Timers not touched in an evaluation are dropped: their condition has cleared.
        """
        begun = start if start is not None else (self.prev_timers.get(key) or self.now)
        self.timers[key] = begun
        deadline = begun + timedelta(seconds=timeout)
        if self.now >= deadline:
            return True
        self.deadlines.append(deadline)
        return False

    def result(
        self,
        phase: Phase,
        reason: str,
        message: str,
        *,
        ever_running: bool,
        ready_pods: frozenset[str],
    ) -> InstanceCondition:
        prev = self.previous
        since = prev.since if prev is not None and prev.phase is phase else self.now
        return InstanceCondition(
            phase=phase,
            reason=reason,
            message=message,
            since=since,
            ever_running=ever_running,
            ready_pods=ready_pods,
            timers=dict(self.timers),
            observations=tuple(self.issues + self.notes),
            next_check=min(self.deadlines) if self.deadlines else None,
        )

    def failed(
        self, failure: Failure, *, ever_running: bool, ready_pods: frozenset[str]
    ) -> InstanceCondition:
        return InstanceCondition(
            phase=Phase.FAILED,
            reason=failure.reason,
            message=failure.message,
            since=self.now,
            ever_running=ever_running,
            ready_pods=ready_pods,
            observations=tuple(self.issues + self.notes),
        )
