"""A step's figures: the p95 read from the latency buckets is within a bucket's width (25 %) of
the true one, and tallies merge as the replicas' rows are summed."""

from __future__ import annotations

import pytest

from service.deployments.canary_figures import BOUNDS, Tally, quantile


@pytest.mark.parametrize("seconds", [0.0005, 0.004, 0.05, 0.3, 2.0, 40.0])
def test_the_p95_is_within_a_bucket_of_the_true_value(seconds: float) -> None:
    tally = Tally()
    for i in range(100):
        tally.add(False, seconds if i < 96 else seconds * 100)
    assert tally.figures().p95_seconds == pytest.approx(seconds, rel=0.25, abs=0.001)


def test_tallies_merge_and_an_empty_one_has_no_latency() -> None:
    assert Tally().figures().p95_seconds == 0.0
    assert quantile([0] * (len(BOUNDS) + 1), 0.95) == 0.0
    a, b = Tally(), Tally()
    for _ in range(3):
        a.add(True, 0.01)
        b.add(False, 0.01)
    a.merge(b)
    figures = a.figures()
    assert (figures.requests, figures.errors, figures.error_rate) == (6, 3, 0.5)
    over = Tally()
    over.add(False, 10_000.0)  # beyond the last bucket
    assert over.figures().p95_seconds == BOUNDS[-1]
