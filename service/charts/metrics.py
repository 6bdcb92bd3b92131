"""The chart pipeline's Prometheus metrics (docs/telemetry.md): fetch and render durations,
cache lookups, and chart-registry errors by kind.

Every label value is one of a fixed few, and every series is created at zero when the metrics
are registered, so dashboards and alerts see them before the first chart is pulled.
"""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry, Counter, Histogram

from service.core.errors import BadGateway, BadRequest

#: seconds: a cache hit takes milliseconds, a pull from a slow registry tens of seconds
FETCH_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
RENDER_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

#: where a fetched archive came from: the on-disk cache (no download) or the registry
FETCH_SOURCES = ("cache", "registry")
#: which Helm path rendered (`RenderOutput.helm_path`), or `failed` when Helm refused
RENDER_PATHS = ("engine", "install", "failed")
#: the on-disk archive cache, and the in-memory cache of renders (and of their checks)
CACHES = ("archive", "render")

#: the kinds of registry error, each with its meaning (docs/telemetry.md lists them)
REGISTRY_ERROR_KINDS = {
    "unreachable": "the registry (or its token server) could not be resolved or reached",
    "refused": "the address, scheme or redirect was refused by the SSRF policy",
    "unauthorized": "every stored credential and anonymous access were refused",
    "not_found": "no such repository, tag or digest",
    "upstream_status": "the registry answered an unexpected HTTP status",
    "invalid_response": "the registry's answer broke the protocol (size, digest, JSON)",
    "invalid_chart": "the artifact is no acceptable chart (not Helm, too large, unsafe)",
    "other": "anything else",
}

# Pulls raise BadGateway (502) for the registry's side and BadRequest (400) for the chart's
# (or the user's); the detail's wording tells the kind (tests/charts/test_metrics.py pins
# each against a real failure).
_Patterns = tuple[tuple[re.Pattern[str], str], ...]
_GATEWAY_KINDS: _Patterns = (
    (re.compile(r"^(Could not (reach|resolve)|Downloading chart .* failed)"), "unreachable"),
    (re.compile(r"^Refused to contact|redirected to"), "refused"),
    (re.compile(r" answered \d{3}\b"), "upstream_status"),
)
_REQUEST_KINDS: _Patterns = (
    (re.compile(r"does not resolve"), "unreachable"),
    (re.compile(r"resolves to the .* address"), "refused"),
    (re.compile(r"^no credential was valid"), "unauthorized"),
    (re.compile(r"^chart .* not found"), "not_found"),
)


def registry_error_kind(exc: BaseException) -> str:
    """The kind (a key of `REGISTRY_ERROR_KINDS`) of an error raised by a chart pull."""
    patterns: _Patterns
    if isinstance(exc, BadGateway):
        patterns, default = _GATEWAY_KINDS, "invalid_response"
    elif isinstance(exc, BadRequest):
        patterns, default = _REQUEST_KINDS, "invalid_chart"
    else:
        return "other"
    for pattern, kind in patterns:
        if pattern.search(exc.detail):
            return kind
    return default


class ChartMetrics:
    """The chart metric families, registered on `registry` (a private one by default, for
    pipelines built outside an application)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        registry = registry if registry is not None else CollectorRegistry()
        fetch = Histogram(
            "nvcf_chart_fetch_duration_seconds",
            "Chart fetches (registry pull or cache) that succeeded, by where the archive "
            "came from.",
            ["source"],
            registry=registry,
            buckets=FETCH_BUCKETS,
        )
        render = Histogram(
            "nvcf_chart_render_duration_seconds",
            "Helm renders in the worker processes (cache hits excluded), by Helm path.",
            ["helm_path"],
            registry=registry,
            buckets=RENDER_BUCKETS,
        )
        cache = Counter(
            "nvcf_chart_cache_lookups_total",
            "Chart cache lookups by cache (archive: on disk; render: in memory) and result.",
            ["cache", "result"],
            registry=registry,
        )
        errors = Counter(
            "nvcf_registry_errors_total",
            "Failed chart pulls from registries, by kind of error.",
            ["kind"],
            registry=registry,
        )
        # Children made once (and so exported at zero from the start).
        self.fetch = {s: fetch.labels(s) for s in FETCH_SOURCES}
        self.render = {p: render.labels(p) for p in RENDER_PATHS}
        self.cache = {(c, r): cache.labels(c, r) for c in CACHES for r in ("hit", "miss")}
        self.errors = {k: errors.labels(k) for k in REGISTRY_ERROR_KINDS}

    def fetched(self, from_cache: bool, seconds: float) -> None:
        """A fetch succeeded: its duration, and whether the archive cache had it."""
        self.fetch["cache" if from_cache else "registry"].observe(seconds)
        self.cache[("archive", "hit" if from_cache else "miss")].inc()

    def rendered(self, helm_path: str, seconds: float) -> None:
        """A render in a worker ended (`failed` when Helm refused it)."""
        self.render[helm_path if helm_path in self.render else "failed"].observe(seconds)

    def render_lookup(self, hit: bool) -> None:
        self.cache[("render", "hit" if hit else "miss")].inc()

    def registry_error(self, exc: BaseException) -> str:
        """Count a failed pull; its kind."""
        kind = registry_error_kind(exc)
        self.errors[kind].inc()
        return kind


__all__ = ["REGISTRY_ERROR_KINDS", "ChartMetrics", "registry_error_kind"]
