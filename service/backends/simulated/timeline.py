"""The simulated pod timeline: when a bound pod's containers start, become ready, finish, crash
and restart, from its scheduling time, the configured delays and its fault annotations.

Everything is computed from the pod's timeline at a given `now`, so a fake clock can jump."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from service.backends.simulated.model import (
    CRASH_BACKOFF_CAP,
    SimPod,
    SimulationDelays,
    as_list,
    as_map,
    secs,
    ts,
)


@dataclass(frozen=True)
class ContainerTimeline:
    """What a scheduled pod's main containers look like at one moment."""

    phase: str
    state: dict[str, Any]
    ready: bool
    ready_since: datetime
    restart_count: int = 0
    last_state: dict[str, Any] | None = None
    not_ready_reason: str = "ContainersNotReady"


def human_seconds(seconds: float) -> str:
    """Go-style duration as kubelet prints back-off (`10s`, `1m20s`, `5m0s`)."""
    whole = round(seconds)
    if whole < 60:
        return f"{seconds:g}s" if seconds < 1 else f"{whole}s"
    minutes, secs_ = divmod(whole, 60)
    return f"{minutes}m{secs_}s"


def pull_error(image: str) -> str:
    return (
        f'rpc error: code = NotFound desc = failed to pull and unpack image "{image}": '
        f'"{image}": not found'
    )


def image_of(pod: SimPod) -> str:
    containers = as_list(pod.spec.get("containers"))
    return str(as_map(containers[0]).get("image", "")) if containers else ""


def container_name(pod: SimPod) -> str:
    containers = as_list(pod.spec.get("containers"))
    return str(as_map(containers[0]).get("name", "")) if containers else ""


class PodTimeline:
    """The phases of pods over time under one cluster's delays."""

    def __init__(self, delays: SimulationDelays) -> None:
        self.delays = delays

    def crashes(self, pod: SimPod) -> bool:
        if pod.fault == "CrashLoopBackOff":
            return True
        # A Job's pods are expected to run to completion; any "unhealthy" fault fails them.
        return pod.in_job and pod.fault in ("NeverReady", "FailAfterReady")

    def run_seconds(self) -> float:
        return max(self.delays.ready_seconds, 0.1)

    def init_done_at(self, pod: SimPod) -> datetime:
        assert pod.scheduled_at is not None
        has_init = bool(as_list(pod.spec.get("initContainers")))
        return pod.scheduled_at + secs(self.delays.pull_seconds if has_init else 0.0)

    def started_at(self, pod: SimPod) -> datetime:
        return self.init_done_at(pod) + secs(self.delays.pull_seconds)

    def terminal_at(self, pod: SimPod) -> datetime | None:
        """When the pod reaches Succeeded or Failed, if it ever does."""
        if pod.scheduled_at is None or pod.fault in ("ImagePullBackOff", "Unschedulable"):
            return None
        start = self.started_at(pod)
        if pod.script is not None:
            end = pod.script.ends(start, pod.stop_at)
            return end[0] if end is not None else None
        if self.crashes(pod):
            return start + secs(self.run_seconds()) if pod.restart_policy == "Never" else None
        if pod.in_job:
            return start + secs(pod.ready_after)
        return None

    def first_ready_at(self, pod: SimPod) -> datetime | None:
        if pod.scheduled_at is None or pod.fault not in (None, "FailAfterReady"):
            return None
        start = self.started_at(pod)
        return start if pod.in_job else start + secs(pod.ready_after)

    def job_failed_at(self, pod: SimPod) -> datetime | None:
        if pod.script is not None and pod.scheduled_at is not None and pod.fault is None:
            end = pod.script.ends(self.started_at(pod), pod.stop_at)
            return end[0] if end is not None and end[1] != 0 else None
        if not pod.in_job or pod.scheduled_at is None or not self.crashes(pod):
            return None
        return self.started_at(pod) + secs(self.run_seconds())

    def main(
        self, pod: SimPod, now: datetime, started: datetime, namespace: str
    ) -> ContainerTimeline:
        """The pod's main containers at `now`, once its init containers are done."""
        scheduled = pod.scheduled_at or started
        image = image_of(pod)
        if now < started:
            creating = {"waiting": {"reason": "ContainerCreating"}}
            return ContainerTimeline("Pending", creating, False, scheduled)
        if pod.fault == "ImagePullBackOff":
            backoff = now >= started + secs(max(self.delays.pull_seconds, 1.0))
            if backoff:
                waiting = {
                    "reason": "ImagePullBackOff",
                    "message": f'Back-off pulling image "{image}"',
                }
            else:
                waiting = {"reason": "ErrImagePull", "message": pull_error(image)}
            state: dict[str, Any] = {"waiting": waiting}
            return ContainerTimeline("Pending", state, False, scheduled)
        running = {"running": {"startedAt": ts(started)}}
        if pod.script is not None and pod.fault is None:
            return self._task(pod, now, started, running)
        if self.crashes(pod):
            return self._crash(pod, now, started, namespace)
        if pod.in_job:
            done = started + secs(pod.ready_after)
            if now < done:
                return ContainerTimeline("Running", running, True, started)
            state = {
                "terminated": {
                    "exitCode": 0,
                    "reason": "Completed",
                    "startedAt": ts(started),
                    "finishedAt": ts(done),
                }
            }
            return ContainerTimeline(
                "Succeeded", state, False, done, not_ready_reason="PodCompleted"
            )
        if pod.fault == "NeverReady":
            return ContainerTimeline("Running", running, False, scheduled)
        ready_at = started + secs(pod.ready_after)
        if now < ready_at:
            return ContainerTimeline("Running", running, False, scheduled)
        if pod.fault == "FailAfterReady":
            failed_at = ready_at + secs(pod.fail_after)
            if now >= failed_at:
                return ContainerTimeline("Running", running, False, failed_at)
        return ContainerTimeline("Running", running, True, ready_at)

    def _task(
        self, pod: SimPod, now: datetime, started: datetime, running: dict[str, Any]
    ) -> ContainerTimeline:
        """A task container playing its script (simulated/tasks.py)."""
        assert pod.script is not None
        end = pod.script.ends(started, pod.stop_at)
        if end is None or now < end[0]:
            return ContainerTimeline("Running", running, True, started)
        at, code, reason = end
        state = {
            "terminated": {
                "exitCode": code,
                "reason": reason,
                "startedAt": ts(started),
                "finishedAt": ts(at),
            }
        }
        phase = "Succeeded" if code == 0 else "Failed"
        return ContainerTimeline(phase, state, False, at, not_ready_reason=f"Pod{phase}")

    def _crash(
        self, pod: SimPod, now: datetime, started: datetime, namespace: str
    ) -> ContainerTimeline:
        run = self.run_seconds()
        crashed_at = started + secs(run)
        terminated = {
            "terminated": {
                "exitCode": 1,
                "reason": "Error",
                "startedAt": ts(started),
                "finishedAt": ts(crashed_at),
            }
        }
        # Never ready: the pod's Ready condition stays False from its first status (its launch).
        launched = pod.scheduled_at or started
        if now < crashed_at:
            running = {"running": {"startedAt": ts(started)}}
            return ContainerTimeline("Running", running, False, launched)
        if pod.restart_policy == "Never":
            return ContainerTimeline(
                "Failed", terminated, False, launched, not_ready_reason="PodFailed"
            )
        base = min(10.0, run)
        restarts = 0
        run_start, run_end = started, crashed_at
        while True:
            backoff = min(base * 2**restarts, CRASH_BACKOFF_CAP)
            next_start = run_end + secs(backoff)
            last = {
                "terminated": {
                    "exitCode": 1,
                    "reason": "Error",
                    "startedAt": ts(run_start),
                    "finishedAt": ts(run_end),
                }
            }
            if now < next_start:
                message = (
                    f"back-off {human_seconds(backoff)} restarting failed container="
                    f"{container_name(pod)} pod={pod.name}_{namespace}({pod.uid})"
                )
                state = {"waiting": {"reason": "CrashLoopBackOff", "message": message}}
                return ContainerTimeline("Running", state, False, launched, restarts + 1, last)
            restarts += 1
            run_start, run_end = next_start, next_start + secs(run)
            if now < run_end:
                state = {"running": {"startedAt": ts(run_start)}}
                return ContainerTimeline("Running", state, False, launched, restarts, last)


def next_change(timeline: PodTimeline, pod: SimPod, now: datetime) -> datetime | None:
    """The next moment after `now` at which a bound pod's rendered state changes by time
    alone (None: never again, or not bound: binding is the scheduler's change). Covers every
    moment `PodTimeline.main` and the pod's rendering switch at."""
    if pod.scheduled_at is None:
        return None
    start = timeline.started_at(pod)
    times = [pod.scheduled_at, timeline.init_done_at(pod), start]
    if pod.fault == "ImagePullBackOff":
        times.append(start + secs(max(timeline.delays.pull_seconds, 1.0)))
    elif pod.script is not None and pod.fault is None:
        times += pod.script.times(start, pod.stop_at)
    elif timeline.crashes(pod):
        times.append(_next_crash_step(timeline, pod, start, now))
    elif pod.in_job:
        times.append(start + secs(pod.ready_after))
    elif pod.fault != "NeverReady":
        ready = start + secs(pod.ready_after)
        times.append(ready)
        if pod.fault == "FailAfterReady":
            times.append(ready + secs(pod.fail_after))
    return min((t for t in times if t > now), default=None)


def _next_crash_step(
    timeline: PodTimeline, pod: SimPod, start: datetime, now: datetime
) -> datetime:
    """The next crash or restart of a crash-looping pod after `now` (as `PodTimeline._crash`
    lays them out)."""
    run = timeline.run_seconds()
    end = start + secs(run)
    if pod.restart_policy == "Never" or end > now:
        return end
    base = min(10.0, run)
    restarts = 0
    while True:
        restart = end + secs(min(base * 2**restarts, CRASH_BACKOFF_CAP))
        if restart > now:
            return restart
        restarts += 1
        end = restart + secs(run)
        if end > now:
            return end
