"""Reading `/metrics` in tests: the samples of one scrape, by name and labels."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Scrape:
    """One Prometheus text exposition, parsed."""

    #: family name -> type (counter, gauge, histogram, ...)
    families: dict[str, str]
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float]

    @classmethod
    def parse(cls, text: str) -> Scrape:
        families: dict[str, str] = {}
        samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for family in text_string_to_metric_families(text):
            families[family.name] = family.type
            for s in family.samples:
                samples[(s.name, frozenset(s.labels.items()))] = s.value
        return cls(families, samples)

    @property
    def names(self) -> set[str]:
        """Every family and sample name (`x`, `x_total`, `x_bucket`, ...)."""
        return set(self.families) | {name for name, _ in self.samples}

    def value(self, name: str, **labels: str) -> float:
        """The sample's value; 0 when absent (a series not created yet)."""
        return self.samples.get((name, frozenset(labels.items())), 0.0)

    def total(self, name: str, **labels: str) -> float:
        """The sum over every sample of `name` whose labels include `labels`."""
        wanted = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and wanted <= ls)


async def scrape(client: httpx.AsyncClient) -> Scrape:
    resp = await client.get("/metrics")
    assert resp.status_code == 200, resp.text
    return Scrape.parse(resp.text)
