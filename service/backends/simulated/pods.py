"""Status rendering of simulated pods: the Pod objects, container statuses, conditions and
events a kubelet would report for a pod at one moment of its timeline."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from service.backends.simulated.model import (
    Namespace,
    SimPod,
    as_list,
    as_map,
    name_suffix,
    secs,
    ts,
)
from service.backends.simulated.timeline import (
    ContainerTimeline,
    PodTimeline,
    container_name,
    image_of,
    pull_error,
)


def event(
    ns: Namespace,
    kind: str,
    name: str,
    reason: str,
    message: str,
    first: datetime,
    last: datetime,
    count: int = 1,
) -> dict[str, Any]:
    """A Warning event about the object, as the scheduler or kubelet would record it."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{name}.{name_suffix(f'{kind}/{name}/{reason}', 16)}",
            "namespace": ns.instance.namespace,
        },
        "involvedObject": {
            "apiVersion": "apps/v1"
            if kind in ("Deployment", "ReplicaSet", "StatefulSet")
            else "v1",
            "kind": kind,
            "name": name,
            "namespace": ns.instance.namespace,
        },
        "type": "Warning",
        "reason": reason,
        "message": message,
        "firstTimestamp": ts(first),
        "lastTimestamp": ts(max(first, last)),
        "count": max(count, 1),
        "source": {"component": "kubelet" if reason != "FailedScheduling" else "default-scheduler"},
    }


class PodRenderer:
    """Pod objects with their status (and the events about them) at a given `now`."""

    def __init__(self, timeline: PodTimeline, node_index: Mapping[str, int]) -> None:
        self.timeline = timeline
        self.node_index = node_index

    def render(
        self, ns: Namespace, pod: SimPod, now: datetime
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        metadata: dict[str, Any] = {
            "name": pod.name,
            "namespace": ns.instance.namespace,
            "uid": pod.uid,
            "labels": dict(pod.labels),
            "annotations": dict(pod.annotations),
            "creationTimestamp": ts(pod.created_at),
        }
        if pod.owner_kind:
            metadata["ownerReferences"] = [
                {
                    "apiVersion": "batch/v1" if pod.owner_kind == "Job" else "apps/v1",
                    "kind": pod.owner_kind,
                    "name": pod.owner_name,
                    "uid": pod.owner_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ]
        spec = dict(pod.spec)  # only top-level keys are set below
        spec.setdefault("restartPolicy", "Always")
        status, events = self._status(ns, pod, now)
        if pod.node is not None:
            spec["nodeName"] = pod.node
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": metadata,
            "spec": spec,
            "status": status,
        }, events

    def _status(
        self, ns: Namespace, pod: SimPod, now: datetime
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        events: list[dict[str, Any]] = []
        status: dict[str, Any] = {"phase": "Pending", "qosClass": "Burstable"}
        if pod.unschedulable_since is not None:
            until = pod.scheduled_at or now
            events.append(
                event(
                    ns,
                    "Pod",
                    pod.name,
                    "FailedScheduling",
                    pod.schedule_message,
                    pod.unschedulable_since,
                    until,
                )
            )
        if pod.node is None or pod.scheduled_at is None:
            if pod.unschedulable_since is not None:
                status["conditions"] = [
                    condition(
                        "PodScheduled",
                        "False",
                        pod.unschedulable_since,
                        "Unschedulable",
                        pod.schedule_message,
                    )
                ]
            return status, events

        scheduled = pod.scheduled_at
        node_index = self.node_index[pod.node]
        status.update(
            hostIP=f"10.0.0.{node_index + 1}",
            podIP=f"10.244.{node_index}.{pod.seq % 250 + 2}",
            startTime=ts(scheduled),
        )
        containers = [as_map(c) for c in as_list(pod.spec.get("containers"))]
        inits = [as_map(c) for c in as_list(pod.spec.get("initContainers"))]
        init_done = self.timeline.init_done_at(pod)
        conditions = [condition("PodScheduled", "True", scheduled)]
        if inits and now < init_done:
            status["initContainerStatuses"] = [
                container_status(
                    c,
                    {"running": {"startedAt": ts(scheduled)}}
                    if i == 0
                    else {"waiting": {"reason": "PodInitializing"}},
                )
                for i, c in enumerate(inits)
            ]
            status["containerStatuses"] = [
                container_status(c, {"waiting": {"reason": "PodInitializing"}}) for c in containers
            ]
            names = ", ".join(str(c.get("name", "")) for c in inits)
            conditions += [
                condition(
                    "Initialized",
                    "False",
                    scheduled,
                    "ContainersNotInitialized",
                    f"containers with incomplete status: [{names}]",
                ),
                *readiness_conditions(False, scheduled, "ContainersNotReady", containers),
            ]
            status["conditions"] = conditions
            return status, events
        if inits:
            status["initContainerStatuses"] = [
                container_status(
                    c,
                    {
                        "terminated": {
                            "exitCode": 0,
                            "reason": "Completed",
                            "startedAt": ts(scheduled),
                            "finishedAt": ts(init_done),
                        }
                    },
                )
                for c in inits
            ]
        conditions.append(condition("Initialized", "True", init_done))
        started = self.timeline.started_at(pod)
        line = self.timeline.main(pod, now, started, ns.instance.namespace)
        status["phase"] = line.phase
        status["containerStatuses"] = [
            container_status(c, line.state, line.ready, line.restart_count, line.last_state)
            for c in containers
        ]
        conditions += readiness_conditions(
            line.ready, line.ready_since, line.not_ready_reason, containers
        )
        status["conditions"] = conditions
        if line.phase == "Failed":
            status["reason"] = "Error"
        events.extend(self._events(ns, pod, now, started, line))
        return status, events

    def _events(
        self, ns: Namespace, pod: SimPod, now: datetime, started: datetime, line: ContainerTimeline
    ) -> list[dict[str, Any]]:
        if now < started:
            return []
        image = image_of(pod)
        if pod.fault == "ImagePullBackOff":
            return [
                event(
                    ns,
                    "Pod",
                    pod.name,
                    "Failed",
                    f'Failed to pull image "{image}": {pull_error(image)}',
                    started,
                    now,
                ),
                event(
                    ns,
                    "Pod",
                    pod.name,
                    "BackOff",
                    f'Back-off pulling image "{image}"',
                    started,
                    now,
                ),
            ]
        if self.timeline.crashes(pod) and line.restart_count:
            crashed = started + secs(self.timeline.run_seconds())
            return [
                event(
                    ns,
                    "Pod",
                    pod.name,
                    "BackOff",
                    f"Back-off restarting failed container {container_name(pod)} in pod "
                    f"{pod.name}_{ns.instance.namespace}({pod.uid})",
                    crashed,
                    now,
                    line.restart_count,
                )
            ]
        unhealthy_since: datetime | None = None
        if pod.fault == "NeverReady" and not pod.in_job:
            unhealthy_since = started
        elif (
            pod.fault == "FailAfterReady"
            and not pod.in_job
            and not line.ready
            and now >= started + secs(pod.ready_after)
        ):
            unhealthy_since = line.ready_since
        if unhealthy_since is None:
            return []
        return [
            event(
                ns,
                "Pod",
                pod.name,
                "Unhealthy",
                "Readiness probe failed: HTTP probe failed with statuscode: 503",
                unhealthy_since,
                now,
            )
        ]


def condition(
    type_: str, status: str, at: datetime, reason: str = "", message: str = ""
) -> dict[str, Any]:
    cond: dict[str, Any] = {
        "type": type_,
        "status": status,
        "lastProbeTime": None,
        "lastTransitionTime": ts(at),
    }
    if reason:
        cond["reason"] = reason
    if message:
        cond["message"] = message
    return cond


def readiness_conditions(
    ready: bool, since: datetime, reason: str, containers: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    if ready:
        return [condition("ContainersReady", "True", since), condition("Ready", "True", since)]
    names = ", ".join(str(c.get("name", "")) for c in containers)
    message = "" if reason == "PodCompleted" else f"containers with unready status: [{names}]"
    return [
        condition("ContainersReady", "False", since, reason, message),
        condition("Ready", "False", since, reason, message),
    ]


def container_status(
    container: Mapping[str, Any],
    state: dict[str, Any],
    ready: bool = False,
    restart_count: int = 0,
    last_state: dict[str, Any] | None = None,
) -> dict[str, Any]:
    running = "running" in state
    image = str(container.get("image", ""))
    out: dict[str, Any] = {
        "name": str(container.get("name", "")),
        "image": image,
        "imageID": ""
        if "waiting" in state
        else f"{image}@sha256:{hashlib.sha256(image.encode()).hexdigest()}",
        "ready": ready,
        "restartCount": restart_count,
        "started": running,
        "state": state,
        "lastState": last_state or {},
    }
    return out


def is_ready(pod: Mapping[str, Any]) -> bool:
    for cond in as_list(as_map(pod.get("status")).get("conditions")):
        if as_map(cond).get("type") == "Ready":
            return as_map(cond).get("status") == "True"
    return False
