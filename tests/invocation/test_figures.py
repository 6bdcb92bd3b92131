"""This replica's measurements of the versions under a canary release: only those versions are
counted (memory bounded by the releases under way), on /metrics with their role and weight,
and their series go when the release ends."""

from __future__ import annotations

import uuid

from prometheus_client import CollectorRegistry, generate_latest

from service.deployments.canary_figures import Watched
from service.invocation.figures import Measured
from tests.support.invocation import sample

FUNCTION, RELEASE = uuid.UUID(int=1), uuid.UUID(int=2)
CANARY, STABLE, OTHER = uuid.UUID(int=10), uuid.UUID(int=11), uuid.UUID(int=12)


def watching(weight: int) -> dict[uuid.UUID, Watched]:
    return {
        CANARY: Watched(RELEASE, 0, FUNCTION, "canary", weight),
        STABLE: Watched(RELEASE, 0, FUNCTION, "stable", 100 - weight),
    }


def test_only_the_versions_under_a_release_are_counted_with_their_role_and_weight() -> None:
    registry = CollectorRegistry()
    measured = Measured(registry)
    measured.add(str(CANARY), False, 0.01)  # before the release is known: not counted
    measured.watch(watching(10))
    for i in range(10):
        measured.add(str(CANARY), i % 5 == 0, 0.02)
        measured.add(str(STABLE), False, 0.01)
        measured.add(str(OTHER), False, 0.01)
    taken = measured.take()
    assert set(taken) == {CANARY, STABLE}
    assert (taken[CANARY].requests, taken[CANARY].errors) == (10, 2)
    assert measured.take() == {}
    text = generate_latest(registry).decode()
    canary = {"version_id": str(CANARY), "role": "canary", "weight": "10"}
    assert sample(text, "nvcf_canary_requests_total", outcome="errored", **canary) == 2
    assert sample(text, "nvcf_canary_requests_total", outcome="fulfilled", **canary) == 8
    assert sample(text, "nvcf_canary_duration_seconds_count", **canary) == 10
    assert sample(text, "nvcf_canary_weight", version_id=str(STABLE), role="stable") == 90
    assert str(OTHER) not in text
    # the release ended: its versions are neither counted nor shown any more
    measured.watch({})
    measured.add(str(CANARY), False, 0.01)
    assert measured.take() == {}
    text = generate_latest(registry).decode()
    assert str(CANARY) not in text and str(STABLE) not in text
