"""The failures judged as NVCA judges them (its own tests and the helm-functions document's
immediate-failure list): an evicted pod of a Deployment's ReplicaSet does not fail the
instance by itself, a pod the kubelet refused at admission fails it at once, and a Warning
event saying `forbidden` about a tracked (rendered) object is terminal."""

from __future__ import annotations

from service.health import ObjectRef, Phase, evaluate
from tests.support.health import (
    DEFAULTS,
    T0,
    at,
    container,
    deployment,
    pod,
    roundtrip,
    state,
    warning,
)

EVICTED = pod(
    "web-5d4f8c-old",
    phase="Failed",
    reason="Evicted",
    message="The node was low on resource: ephemeral-storage.",
    containers=(container(running=False),),
)


def test_an_evicted_replicaset_pod_never_fails_the_instance_by_itself() -> None:
    # not replaced yet, long past the failing-objects backoff: still not failed
    observed = state(EVICTED, controllers=(deployment(ready=0),))
    first = evaluate(observed, None, T0)
    assert first.phase is not Phase.FAILED, first.message
    later = evaluate(observed, roundtrip(first), at(DEFAULTS.failing_backoff * 10))
    assert later.phase is not Phase.FAILED, later.message

    # replaced: the instance is Running, the eviction only noted
    replaced = state(EVICTED, pod("web-5d4f8c-new", ready=True), controllers=(deployment(ready=1),))
    running = evaluate(replaced, None, T0)
    assert running.phase is Phase.RUNNING, running.message


def test_an_evicted_standalone_pod_still_fails_the_instance() -> None:
    standalone = pod(
        "solo",
        phase="Failed",
        reason="Evicted",
        message="The node was low on resource: memory.",
        owner=("", ""),
        containers=(container(running=False),),
    )
    failed = evaluate(state(standalone), None, T0)
    assert (failed.phase, failed.reason) == (Phase.FAILED, "PodFailed")


def test_a_pod_rejected_at_admission_fails_at_once_whoever_owns_it() -> None:
    rejected = pod(
        "web-5d4f8c-x",
        phase="Failed",
        reason="UnexpectedAdmissionError",
        message="Allocate failed due to requested number of devices unavailable for "
        "nvidia.com/gpu. Requested: 1, Available: 0, which is unexpected",
        containers=(container(running=False),),
    )
    failed = evaluate(state(rejected, controllers=(deployment(ready=0),)), None, T0)
    assert (failed.phase, failed.reason) == (Phase.FAILED, "PodFailed")
    assert "UnexpectedAdmissionError" in failed.message
    assert "requested number of devices unavailable" in failed.message


def test_a_forbidden_warning_on_a_tracked_object_is_terminal() -> None:
    forbidden = warning(
        "FailedToUpdateEndpoint",
        'endpoints "web" is forbidden: User "system:serviceaccount:kube-system:endpoint-'
        'controller" cannot update resource "endpoints"',
        kind="Service",
        name="web",
    )
    tracked = state(
        pod(ready=False),
        events=(forbidden,),
        expected=frozenset({ObjectRef("Service", "web")}),
        present=frozenset({ObjectRef("Service", "web")}),
    )
    failed = evaluate(tracked, None, T0)
    assert (failed.phase, failed.reason) == (Phase.FAILED, "FailedToUpdateEndpoint")
    assert "is forbidden" in failed.message

    # about an object the instance did not render: judged by what it holds back
    untracked = state(pod(ready=False), events=(forbidden,))
    assert evaluate(untracked, None, T0).phase is not Phase.FAILED


def test_failed_create_forbidden_on_a_top_level_statefulset_is_immediate() -> None:
    event = warning(
        "FailedCreate",
        'create Pod db-0 in StatefulSet db failed error: pods "db-0" is forbidden: '
        "violates PodSecurity",
        kind="StatefulSet",
        name="db",
    )
    db = frozenset({ObjectRef("StatefulSet", "db")})
    observed = state(events=(event,), expected=db, present=db)
    failed = evaluate(observed, None, T0)
    assert (failed.phase, failed.reason) == (Phase.FAILED, "FailedCreate")
