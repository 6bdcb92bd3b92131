"""Counters and histograms cheap enough to update on every request of the hot path.

prometheus_client's `Counter` and `Histogram` take a lock and make half a dozen calls per
update (observability checks, the value object, the bucket's value object), which on the
invocation path cost more than some of its real work. These keep plain numbers per label
values, in cells the caller may hold on to, and become Prometheus samples only when the
registry is collected (`/metrics`), through prometheus_client's documented custom-collector
interface — with the very names, labels, order and `_created` samples its own classes give.
Updates are made on the event loop's thread; the collector reads a copy of the cells, so a
scrape from any thread sees each cell whole or not yet.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import ClassVar, Generic, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import INF, floatToGoString


class CounterCell:
    """One counter's value for one set of label values."""

    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()


class HistogramCell:
    """One histogram's observations for one set of label values: a count per bucket (not
    cumulative: the collector adds them up), and their sum."""

    __slots__ = ("bounds", "counts", "created", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value


_Cell = TypeVar("_Cell", CounterCell, HistogramCell)


class _Family(Collector, Generic[_Cell]):
    """A family of cells by label values; `kind` is its Prometheus type."""

    kind: ClassVar[str]

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        registry: CollectorRegistry | None,
    ) -> None:
        # a counter's family is named without `_total` (prometheus_client's `Counter` takes
        # either)
        self.name = name.removesuffix("_total") if self.kind == "counter" else name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._cells: dict[tuple[str, ...], _Cell] = {}
        if registry is not None:
            registry.register(self)

    def cell(self, *values: str) -> _Cell:
        """The cell of these label values (made at the first call)."""
        cell = self._cells.get(values)
        if cell is None:
            self._labels(values)
            cell = self._cells[values] = self._new()
        return cell

    def _new(self) -> _Cell:
        raise NotImplementedError

    def _labels(self, values: tuple[str, ...]) -> dict[str, str]:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name}: expected label values for {self.labelnames}")
        return dict(zip(self.labelnames, values, strict=True))

    def describe(self) -> Iterator[Metric]:
        yield Metric(self.name, self.documentation, self.kind)


class CounterTable(_Family[CounterCell]):
    """A counter family (`name` with `_total` or without, as prometheus_client's `Counter`
    takes it)."""

    kind = "counter"

    def _new(self) -> CounterCell:
        return CounterCell()

    def collect(self) -> Iterator[Metric]:
        metric = Metric(self.name, self.documentation, self.kind)
        for values, cell in list(self._cells.items()):
            labels = self._labels(values)
            metric.add_sample(self.name + "_total", labels, cell.value)
            metric.add_sample(self.name + "_created", labels, cell.created)
        yield metric


class HistogramTable(_Family[HistogramCell]):
    """A histogram family with the upper bounds `buckets` (+Inf is added)."""

    kind = "histogram"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        registry: CollectorRegistry | None,
        *,
        buckets: Sequence[float],
    ) -> None:
        bounds = sorted(float(b) for b in buckets)
        if not bounds or bounds[-1] != INF:
            bounds.append(INF)
        self.bounds = tuple(bounds)
        super().__init__(name, documentation, labelnames, registry)

    def _new(self) -> HistogramCell:
        return HistogramCell(self.bounds)

    def collect(self) -> Iterator[Metric]:
        metric = Metric(self.name, self.documentation, self.kind)
        les = [floatToGoString(b) for b in self.bounds]  # type: ignore[no-untyped-call]
        for values, cell in list(self._cells.items()):
            labels = self._labels(values)
            counts, total = list(cell.counts), cell.sum
            acc = 0.0
            for le, count in zip(les, counts, strict=True):
                acc += count
                metric.add_sample(self.name + "_bucket", {**labels, "le": le}, acc)
            metric.add_sample(self.name + "_count", labels, acc)
            metric.add_sample(self.name + "_sum", labels, total)
            metric.add_sample(self.name + "_created", labels, cell.created)
        yield metric


__all__ = ["CounterCell", "CounterTable", "HistogramCell", "HistogramTable"]
