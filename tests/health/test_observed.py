"""The observed-state model: where a pod's clocks start, what its status says about earlier
readiness, and the controller fields the health machine judges by (parsed from API JSON)."""

from __future__ import annotations

from typing import Any

import pytest

from service.health import Condition, ObservedState, Pod
from tests.support.health import RESTARTED_ONCE, T0, at, container, pod


def test_a_pod_is_launched_at_its_start_time() -> None:
    assert pod(created=T0, launched=at(40)).launched == at(40)


def test_an_unscheduled_pod_is_launched_when_the_scheduler_first_refused_it() -> None:
    refused = Condition("PodScheduled", "False", "Unschedulable", "", at(3))
    unscheduled = pod(scheduled=False)
    assert unscheduled.launched == T0  # no timestamp on the condition: its creation
    assert Pod("p", conditions=(refused,), created=T0).launched == at(3)
    assert Pod("p").launched is None


# (row, pod, was ready before, not ready since)
EVIDENCE: list[tuple[str, Pod, bool, Any]] = [
    ("Ready now", pod(ready=True, ready_changed=at(10)), False, None),
    ("Ready False since launch", pod(ready_changed=T0), False, None),
    ("Ready False 1 s after launch (first status)", pod(ready_changed=at(1)), False, None),
    ("Ready went False later", pod(ready_changed=at(1.5)), True, at(1.5)),
    ("no Ready timestamp, no restarts", pod(), False, None),
    ("no Ready timestamp, a restarted container", pod(containers=RESTARTED_ONCE), True, None),
    (
        "the timestamp decides over restarts",
        pod(containers=RESTARTED_ONCE, ready_changed=T0),
        False,
        None,
    ),
    (
        "restarted, no lastState",
        pod(containers=(container(running=True, restarts=1),)),
        False,
        None,
    ),
]


@pytest.mark.parametrize(
    ("observed_pod", "was_ready", "since"), [r[1:] for r in EVIDENCE], ids=[r[0] for r in EVIDENCE]
)
def test_earlier_readiness_from_the_pod_status(
    observed_pod: Pod, was_ready: bool, since: Any
) -> None:
    assert observed_pod.was_ready_before is was_ready
    assert observed_pod.not_ready_since == since


def controller_json(
    kind: str, spec: dict[str, Any], status: dict[str, Any], **meta: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1" if kind in ("Job", "CronJob") else "apps/v1",
        "kind": kind,
        "metadata": {"name": meta.pop("name", kind.lower()), **meta},
        "spec": spec,
        "status": status,
    }


def test_controller_fields_the_machine_judges_by() -> None:
    observed = ObservedState.from_k8s(
        [
            controller_json(
                "Deployment",
                {"replicas": 2, "minReadySeconds": 30},
                {"replicas": 2, "readyReplicas": 2, "availableReplicas": 1},
            ),
            controller_json("StatefulSet", {"replicas": 3}, {"replicas": 1}),
            controller_json(
                "StatefulSet",
                {"replicas": 3, "podManagementPolicy": "Parallel"},
                {"replicas": 1},
                name="parallel",
            ),
            controller_json(
                "Job",
                {"backoffLimit": 2},
                {"succeeded": 1, "failed": 2, "completionTime": "2025-03-01T12:05:00Z"},
            ),
            controller_json("CronJob", {"schedule": "0 3 * * *"}, {}),
            controller_json(
                "Job",
                {},
                {"active": 1},
                name="cronjob-29000",
                ownerReferences=[{"kind": "CronJob", "name": "cronjob", "controller": True}],
            ),
        ]
    )
    dep = observed.controller("Deployment", "deployment")
    assert dep is not None
    assert (dep.min_ready_seconds, dep.ready, dep.satisfied) == (30, True, False)
    ordered = observed.controller("StatefulSet", "statefulset")
    parallel = observed.controller("StatefulSet", "parallel")
    assert ordered is not None and parallel is not None
    assert (ordered.pod_management_policy, ordered.creating_pods) == ("OrderedReady", False)
    assert (parallel.pod_management_policy, parallel.creating_pods) == ("Parallel", True)
    done = observed.controller("Job", "job")
    assert done is not None
    assert (done.backoff_limit, done.completion_time, done.job_complete, done.satisfied) == (
        2,
        at(300),
        True,
        True,
    )
    cron = observed.controller("CronJob", "cronjob")
    run = observed.controller("Job", "cronjob-29000")
    assert cron is not None and cron.satisfied and not cron.creating_pods
    assert run is not None and (run.owner_kind, run.backoff_limit, run.satisfied) == (
        "CronJob",
        6,
        False,
    )
