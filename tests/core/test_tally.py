"""Hot-path counters and histograms (core/tally.py): what /metrics shows of them is exactly
what prometheus_client's own Counter and Histogram show for the same updates."""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from service.core.tally import CounterTable, HistogramTable

BUCKETS = (0.001, 0.01, 0.1, 1)
#: (label values, observed value) — on the bounds, between them, beyond the last
UPDATES = [
    (("GET", "/a"), 0.001),
    (("GET", "/a"), 0.0005),
    (("GET", "/a"), 0.05),
    (("POST", "/b"), 1.0),
    (("POST", "/b"), 7.5),
    (("GET", "/a"), 0.1),
]


def _without_created_values(text: str) -> str:
    """The `_created` samples hold the time each series was made: equal in name and labels,
    not in value."""
    return re.sub(r"(_created\{[^}]*\}) \S+", r"\1 T", text)


def test_the_exposition_is_prometheus_clients_own() -> None:
    theirs = CollectorRegistry()
    counter = Counter("req_total", "Requests.", ["method", "route"], registry=theirs)
    histogram = Histogram(
        "req_seconds", "Latency.", ["method", "route"], registry=theirs, buckets=BUCKETS
    )
    ours = CollectorRegistry()
    counts = CounterTable("req_total", "Requests.", ["method", "route"], ours)
    times = HistogramTable("req_seconds", "Latency.", ["method", "route"], ours, buckets=BUCKETS)
    for labels, value in UPDATES:
        counter.labels(*labels).inc()
        histogram.labels(*labels).observe(value)
        counts.cell(*labels).value += 1
        times.cell(*labels).observe(value)

    expected = _without_created_values(generate_latest(theirs).decode())
    assert _without_created_values(generate_latest(ours).decode()) == expected
    # and the readings tests and dashboards use
    labels = {"method": "GET", "route": "/a"}
    assert ours.get_sample_value("req_total", labels) == 4
    assert ours.get_sample_value("req_seconds_bucket", {**labels, "le": "0.001"}) == 2
    assert ours.get_sample_value("req_seconds_bucket", {**labels, "le": "0.1"}) == 4
    assert ours.get_sample_value("req_seconds_sum", {"method": "POST", "route": "/b"}) == 8.5
    assert (
        ours.get_sample_value("req_seconds_bucket", {"method": "POST", "route": "/b", "le": "+Inf"})
        == 2
    )


def test_a_cell_is_made_once_per_label_values_and_checked_then() -> None:
    registry = CollectorRegistry()
    table = CounterTable("things_total", "Things.", ["kind"], registry)
    assert table.cell("a") is table.cell("a")
    assert table.cell("a") is not table.cell("b")
    with pytest.raises(ValueError, match="kind"):
        table.cell("a", "extra")
    # a family's name cannot be registered twice on one registry (as with prometheus_client)
    with pytest.raises(ValueError):
        CounterTable("things_total", "Again.", ["kind"], registry)


def test_nothing_is_shown_of_a_family_before_its_first_cell() -> None:
    registry = CollectorRegistry()
    HistogramTable("quiet_seconds", "Quiet.", ["kind"], registry, buckets=BUCKETS)
    text = generate_latest(registry).decode()
    assert "# TYPE quiet_seconds histogram" in text
    assert "quiet_seconds_bucket" not in text
