"""Status rendering of the simulated cluster's namespaces: snapshots of the applied objects
with the status their controllers (Deployment, ReplicaSet, StatefulSet, Job) would report,
the ReplicaSets Deployments create, the pods, and the events about them."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from service.backends.simulated.model import (
    PROGRESS_DEADLINE_DEFAULT,
    Namespace,
    SimPod,
    Workload,
    as_list,
    as_map,
    object_uid,
    secs,
    ts,
)
from service.backends.simulated.pods import PodRenderer, condition, event, is_ready
from service.backends.simulated.timeline import PodTimeline
from service.health.observed import ObjectRef, parse_time


class StatusRenderer:
    """Snapshots of one cluster's namespaces at a given `now`."""

    def __init__(self, cluster: str, timeline: PodTimeline, node_index: Mapping[str, int]) -> None:
        self.cluster = cluster
        self.timeline = timeline
        self.pods = PodRenderer(timeline, node_index)

    def snapshot(
        self, ns: Namespace, now: datetime
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The namespace's objects with their status, then the events about them."""
        objects: list[dict[str, Any]] = []
        events: list[dict[str, Any]] = []
        pod_objects: dict[str, dict[str, Any]] = {}
        for pod in ns.pods.values():
            obj, pod_events = self.pods.render(ns, pod, now)
            pod_objects[pod.name] = obj
            events.extend(pod_events)
        for ref, stored in ns.objects.items():
            # Shallow: what changes below is the top level and the metadata; snapshots are only
            # read (observe) or deep-copied for callers (objects).
            obj = {**stored, "metadata": dict(stored.get("metadata") or {})}
            metadata = obj["metadata"]
            metadata.setdefault("uid", object_uid(self.cluster, ns, "object", ref))
            metadata.setdefault("creationTimestamp", ts(ns.created_at))
            workload = ns.workloads.get(ref)
            if workload is not None and ref.kind != "Pod":
                metadata["uid"] = workload.uid
                metadata["creationTimestamp"] = ts(workload.created_at)
                pods = [ns.pods[name] for name in workload.pods if name in ns.pods]
                statuses = [pod_objects[p.name] for p in pods]
                obj["status"], extra = self._controller_status(
                    ns, ref, obj, workload, pods, statuses, now
                )
                events.extend(extra)
                if ref.kind == "Deployment":
                    objects.append(self._replica_set(ns, workload, obj, statuses, now))
            if ref.kind != "Pod":
                objects.append(obj)
        objects.extend(pod_objects.values())
        return objects, events

    def _controller_status(
        self,
        ns: Namespace,
        ref: ObjectRef,
        obj: Mapping[str, Any],
        workload: Workload,
        pods: list[SimPod],
        statuses: list[dict[str, Any]],
        now: datetime,
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        ready = sum(1 for s in statuses if is_ready(s))
        count = len(statuses)
        if ref.kind == "Job":
            return self._job_status(ns, ref, workload, pods, statuses, now)
        min_ready = min_ready_seconds(obj)
        available = available_count(statuses, min_ready, now)
        if ref.kind == "StatefulSet":
            return {
                "observedGeneration": 1,
                "replicas": count,
                "readyReplicas": ready,
                "currentReplicas": count,
                "updatedReplicas": count,
                "availableReplicas": available,
            }, []
        status: dict[str, Any] = {
            "observedGeneration": 1,
            "replicas": count,
            "readyReplicas": ready,
            "availableReplicas": available,
        }
        if ref.kind == "ReplicaSet":
            status["fullyLabeledReplicas"] = count
            return status, []
        status["updatedReplicas"] = count
        if count - available:
            status["unavailableReplicas"] = count - available
        deadline = float(
            as_map(obj.get("spec")).get("progressDeadlineSeconds", PROGRESS_DEADLINE_DEFAULT)
        )
        # a replica is available once it has been ready for minReadySeconds
        ready_times = [self.timeline.first_ready_at(p) for p in pods]
        available_times = [None if t is None else t + secs(min_ready) for t in ready_times]
        complete_at = (
            max((t for t in available_times if t is not None), default=workload.created_at)
            if all(t is not None and t <= now for t in available_times)
            else None
        )
        rs = workload.replica_set
        if complete_at is not None:
            progressing = condition(
                "Progressing",
                "True",
                complete_at,
                "NewReplicaSetAvailable",
                f'ReplicaSet "{rs}" has successfully progressed.',
            )
        elif now >= workload.created_at + secs(deadline):
            progressing = condition(
                "Progressing",
                "False",
                workload.created_at + secs(deadline),
                "ProgressDeadlineExceeded",
                f'ReplicaSet "{rs}" has timed out progressing.',
            )
        else:
            progressing = condition(
                "Progressing",
                "True",
                workload.created_at,
                "ReplicaSetUpdated",
                f'ReplicaSet "{rs}" is progressing.',
            )
        availability = (
            condition(
                "Available",
                "True",
                workload.created_at,
                "MinimumReplicasAvailable",
                "Deployment has minimum availability.",
            )
            if available >= count
            else condition(
                "Available",
                "False",
                workload.created_at,
                "MinimumReplicasUnavailable",
                "Deployment does not have minimum availability.",
            )
        )
        status["conditions"] = [availability, progressing]
        return status, []

    def _job_status(
        self,
        ns: Namespace,
        ref: ObjectRef,
        workload: Workload,
        pods: list[SimPod],
        statuses: list[dict[str, Any]],
        now: datetime,
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        phases = [str(s["status"].get("phase")) for s in statuses]
        status: dict[str, Any] = {
            "startTime": ts(workload.created_at),
            "active": sum(1 for p in phases if p in ("Pending", "Running")),
            "ready": sum(1 for s in statuses if is_ready(s)),
            "succeeded": phases.count("Succeeded"),
            "failed": phases.count("Failed"),
            "terminating": 0,
            "uncountedTerminatedPods": {},
        }
        failed_times = [
            t for t in (self.timeline.job_failed_at(p) for p in pods) if t is not None and t <= now
        ]
        if failed_times:
            at = min(failed_times)
            message = "Job has reached the specified backoff limit"
            status["active"] = 0
            status["failed"] = max(status["failed"], 1)
            status["conditions"] = [
                condition("FailureTarget", "True", at, "BackoffLimitExceeded", message),
                condition("Failed", "True", at, "BackoffLimitExceeded", message),
            ]
            return status, [event(ns, "Job", ref.name, "BackoffLimitExceeded", message, at, now)]
        if pods and all(p == "Succeeded" for p in phases):
            done = max(t for t in (self.timeline.terminal_at(p) for p in pods) if t is not None)
            status["completionTime"] = ts(done)
            status["conditions"] = [
                condition(
                    "SuccessCriteriaMet",
                    "True",
                    done,
                    "CompletionsReached",
                    "Reached expected number of succeeded pods",
                ),
                condition(
                    "Complete",
                    "True",
                    done,
                    "CompletionsReached",
                    "Reached expected number of succeeded pods",
                ),
            ]
        return status, []

    def _replica_set(
        self,
        ns: Namespace,
        workload: Workload,
        deployment: Mapping[str, Any],
        statuses: list[dict[str, Any]],
        now: datetime,
    ) -> dict[str, Any]:
        spec = as_map(deployment.get("spec"))
        ready = sum(1 for s in statuses if is_ready(s))
        available = available_count(statuses, min_ready_seconds(deployment), now)
        return {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": workload.replica_set,
                "namespace": ns.instance.namespace,
                "uid": workload.replica_set_uid,
                "creationTimestamp": ts(workload.created_at),
                "labels": dict(
                    as_map(as_map(spec.get("template")).get("metadata")).get("labels") or {}
                ),
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "name": workload.name,
                        "uid": workload.uid,
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {
                "replicas": len(statuses),
                "minReadySeconds": min_ready_seconds(deployment),
                "template": spec.get("template"),
            },
            "status": {
                "replicas": len(statuses),
                "fullyLabeledReplicas": len(statuses),
                "readyReplicas": ready,
                "availableReplicas": available,
                "observedGeneration": 1,
            },
        }


def min_ready_seconds(obj: Mapping[str, Any]) -> int:
    """`spec.minReadySeconds` of a Deployment, ReplicaSet or StatefulSet (default 0)."""
    try:
        return max(int(as_map(obj.get("spec")).get("minReadySeconds") or 0), 0)
    except (TypeError, ValueError):
        return 0


def available_count(statuses: list[dict[str, Any]], min_ready: int, now: datetime) -> int:
    """Pods ready for at least `min_ready` seconds (by their Ready condition's transition), as
    the controllers count `availableReplicas`."""
    count = 0
    for pod in statuses:
        for cond in as_list(as_map(pod.get("status")).get("conditions")):
            cond = as_map(cond)
            if cond.get("type") != "Ready" or cond.get("status") != "True":
                continue
            since = parse_time(cond.get("lastTransitionTime"))
            if min_ready == 0 or (since is not None and since + secs(min_ready) <= now):
                count += 1
    return count
