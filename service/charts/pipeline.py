"""The chart pipeline as one object (helm.md §1–§5): fetch, render, decode, restrict, modify.

The same `ChartPipeline` serves function creation (`validate_for_create`: the chart's default
values, a placeholder namespace, the configured default kube version), the dry-run endpoint and
deployments (`validate`: a pinned manifest digest re-rendered with a deployment's
`configuration` coalesced over the chart defaults, optionally for a target cluster).

Everything blocking runs off the event loop: pulls and cache I/O in threads (`ChartFetcher`),
renders in isolated worker processes (`ChartRenderer`), decoding and checks in a thread. A
small in-memory LRU of successful renders, keyed by the archive digest and every render input,
spares the worker pool when the same chart is rendered again with the same values.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from cachetools import LRUCache
from sqlalchemy.ext.asyncio import AsyncSession

from service.charts.fetch import ChartFetcher, FetchedChart, RegistryCredential
from service.charts.findings import Finding, KubeObject, PipelineResult
from service.charts.metrics import ChartMetrics
from service.charts.mutate import mutate_for_install
from service.charts.policy import ValidationPolicy
from service.charts.render import (
    DEFAULT_KUBE_VERSION,
    PLACEHOLDER_NAMESPACE,
    ChartRenderer,
    ChartRenderError,
    RenderOutput,
    check_rendered,
    render_checked,
)
from service.charts.target import ChartTarget, nvlink_annotation_findings
from service.charts.url import ChartRef, ChartUrlError, parse_chart_url, redact_url
from service.clusters.instance_types import InstanceType, parse_instance_type
from service.core.errors import DomainError, FieldError, ValidationFailed
from service.core.kube import instance_namespace, is_nvlink
from service.core.tracing import NO_TRACING, Tracing
from service.registry import service as registry_service
from service.registry.models import ArtifactType

if TYPE_CHECKING:
    from service.auth.service import Principal
    from service.clusters.catalog import Cluster
    from service.core.crypto import SecretBox
    from service.core.settings import Settings

log = logging.getLogger(__name__)


class HelmFunctionSpec(Protocol):
    """What creating a helm function asks of its chart (functions.validation.FunctionSpec)."""

    @property
    def helm_chart(self) -> str | None: ...
    @property
    def helm_chart_service_name(self) -> str | None: ...
    @property
    def inference_port(self) -> int | None: ...
    @property
    def helm_validation_policy(self) -> ValidationPolicy: ...


#: Instance id used for the dry-run's install preview (no instance exists).
PLACEHOLDER_INSTANCE_ID = "00000000-0000-0000-0000-000000000000"
#: `inferencePort` assumed for a helm function created without one (the health default).
DEFAULT_INFERENCE_PORT = 8000
RENDER_CACHE_BYTES = 64 * 1024 * 1024
_RENDER_CACHE_MAX_ENTRIES = 256

T = TypeVar("T")


@dataclass
class ChartValidation(PipelineResult):
    """A `PipelineResult` plus the chart it came from."""

    chart_digest: str = ""

    def as_dict(self) -> dict[str, Any]:
        """The dry-run response shape (helm.md §6); null finding fields are omitted."""
        base = super().as_dict()
        out: dict[str, Any] = {"valid": base.pop("valid"), "chartDigest": self.chart_digest}
        for key in ("errors", "warnings", "info"):
            out[key] = [{k: v for k, v in f.items() if v is not None} for f in base.pop(key)]
        out.update(base)
        return out


@dataclass(frozen=True)
class ChartFieldError(FieldError):
    """A chart finding reported as a request error: `field` is "helmChart", `path` is the
    finding's field path inside the rendered object."""

    path: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out = super().as_dict()
        if self.path is not None:
            out["path"] = self.path
        return out


def finding_error(finding: Finding) -> ChartFieldError:
    return ChartFieldError(
        field="helmChart",
        message=finding.message,
        rule=finding.rule,
        object=finding.object,
        path=finding.field,
    )


def chart_validation_failed(url: str, errors: Sequence[Finding]) -> ValidationFailed:
    """The 400 for a chart that broke rules: every error, with rule, object and message."""
    shown = redact_url(url)
    parts = [
        f"{f.rule}" + (f" ({f.object})" if f.object else "") + f": {f.message}" for f in errors
    ]
    noun = "violation" if len(errors) == 1 else "violations"
    return ValidationFailed(
        detail=f"helmChart: chart {shown} failed validation with {len(errors)} {noun}: "
        + "; ".join(parts),
        errors=[finding_error(f) for f in errors],
    )


def parse_ref(url: str) -> ChartRef:
    """`parse_chart_url` with its problems as a 400 listing each one (field `helmChart`)."""
    try:
        return parse_chart_url(url)
    except ChartUrlError as exc:
        raise ValidationFailed.of(exc.field_errors()) from None


def _cache_key(*parts: Any) -> str | None:
    """A canonical JSON key, or None when some part is not JSON data (then no caching)."""
    try:
        return json.dumps(parts, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        return None


def _render_size(output: RenderOutput) -> int:
    return (
        len(output.manifest)
        + sum(len(t) for t in output.hook_templates.values())
        + sum(len(c.get("data", "")) for c in output.crds)
    )


@dataclass(frozen=True)
class _Checked:
    """A checked render, with the objects kept as JSON so every hit gets its own copy."""

    errors: tuple[Finding, ...]
    warnings: tuple[Finding, ...]
    info: tuple[Finding, ...]
    objects_json: str
    workload_config: tuple[tuple[str, bool], ...]
    hooks_skipped: tuple[str, ...]
    crds_skipped: tuple[str, ...]

    @classmethod
    def of(cls, result: PipelineResult) -> _Checked:
        return cls(
            tuple(result.errors),
            tuple(result.warnings),
            tuple(result.info),
            json.dumps(result.objects, separators=(",", ":")),
            tuple(result.workload_config.items()),
            tuple(result.hooks_skipped),
            tuple(result.crds_skipped),
        )

    def fill(self, result: PipelineResult) -> None:
        result.errors = list(self.errors)
        result.warnings = list(self.warnings)
        result.info = list(self.info)
        result.objects = json.loads(self.objects_json)
        result.workload_config = dict(self.workload_config)
        result.hooks_skipped = list(self.hooks_skipped)
        result.crds_skipped = list(self.crds_skipped)


class _LRU(LRUCache[str, T]):
    """A small in-memory LRU bounded in (approximate) bytes and in entries; a value above a
    quarter of the bytes is not kept, nor does a second one replace the first for a key."""

    def __init__(self, max_bytes: int, size: Callable[[T], int]) -> None:
        super().__init__(maxsize=max_bytes, getsizeof=size)

    def put(self, key: str, value: T) -> None:
        if self.getsizeof(value) > self.maxsize // 4 or key in self:
            return
        while len(self) >= _RENDER_CACHE_MAX_ENTRIES:
            self.popitem()
        self[key] = value  # evicts the least recently used entries past maxsize bytes


class ChartPipeline:
    """Fetch → render → decode → restrict → modify, shared by creation, dry-run and deploy."""

    def __init__(
        self,
        fetcher: ChartFetcher,
        renderer: ChartRenderer,
        *,
        box: SecretBox | None = None,
        enforce_security: bool = False,
        default_kube_version: str = DEFAULT_KUBE_VERSION,
        metrics: ChartMetrics | None = None,
        tracing: Tracing = NO_TRACING,
    ) -> None:
        self.fetcher = fetcher
        self.renderer = renderer
        self.metrics = metrics if metrics is not None else ChartMetrics()
        self.tracing = tracing
        self.box = box
        self.enforce_security = enforce_security
        self.default_kube_version = default_kube_version
        self._renders: _LRU[RenderOutput] = _LRU(RENDER_CACHE_BYTES // 2, _render_size)
        self._checked: _LRU[_Checked] = _LRU(
            RENDER_CACHE_BYTES // 2, lambda c: len(c.objects_json) + 200 * len(c.info)
        )

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        box: SecretBox | None,
        *,
        metrics: ChartMetrics | None = None,
        tracing: Tracing = NO_TRACING,
    ) -> ChartPipeline:
        """The pipeline of one server process: cache under `<data_dir>/charts`."""
        fetcher = ChartFetcher(
            Path(settings.data_dir) / "charts",
            allowlist=settings.registry_allowlist,
            insecure=settings.insecure_registries,
            max_bytes=settings.chart_max_bytes,
            max_unpacked_bytes=settings.chart_max_unpacked_bytes,
            cache_max_bytes=settings.chart_cache_max_bytes,
            timeout=settings.chart_fetch_timeout,
        )
        renderer = ChartRenderer(
            workers=settings.render_workers,
            timeout=settings.render_timeout,
            memory_limit_bytes=settings.render_memory_limit_bytes,
            helm_engine_path=settings.helm_engine_path,
        )
        return cls(
            fetcher,
            renderer,
            box=box,
            enforce_security=settings.helm_enforce_security,
            default_kube_version=settings.default_kube_version,
            metrics=metrics,
            tracing=tracing,
        )

    async def aclose(self) -> None:
        """Stop the render worker processes."""
        await self.renderer.aclose()

    # --- fetch ---------------------------------------------------------------------------

    async def credentials(
        self, session: AsyncSession, account_id: str, ref: ChartRef
    ) -> list[RegistryCredential]:
        """The account's HELM credentials for the chart's registry host, oldest first."""
        if self.box is None:
            return []
        pairs = await registry_service.credentials_for_host(
            session, account_id, ref.host, box=self.box, artifact_type=ArtifactType.HELM
        )
        return [RegistryCredential(username, password) for username, password in pairs]

    async def fetch(
        self,
        session: AsyncSession,
        account_id: str,
        helm_chart: str | ChartRef,
        *,
        digest: str | None = None,
    ) -> FetchedChart:
        """Pull the chart (by tag, or the pinned manifest `digest`) into the cache.

        A pinned digest already cached is served without touching the registry or the
        database. Raises 400 (bad URL, SSRF refusal, not found, refused credentials, unsafe
        archive) or 502 (registry unreachable or failing); each failed pull is counted by
        kind and logged (a warning when the registry's side failed).
        """
        ref = helm_chart if isinstance(helm_chart, ChartRef) else parse_ref(helm_chart)
        source = redact_url(ref.url)
        with self.tracing.span("chart.fetch", {"nvcf.chart": source}) as span:
            started = time.perf_counter()
            try:
                fetched = await self._fetch(session, account_id, ref, digest)
            except DomainError as exc:
                kind = self.metrics.registry_error(exc)
                log.log(
                    logging.WARNING if exc.status >= 500 else logging.INFO,
                    "chart pull failed (%s): %s",
                    kind,
                    exc.detail,
                    extra={"registryErrorKind": kind},
                )
                raise
            self.metrics.fetched(fetched.cached, time.perf_counter() - started)
            if span is not None:
                span.set_attribute("nvcf.chart.cached", fetched.cached)
            return fetched

    async def _fetch(
        self, session: AsyncSession, account_id: str, ref: ChartRef, digest: str | None
    ) -> FetchedChart:
        if digest is not None and (hit := await self.fetcher.cached(ref, digest)) is not None:
            return hit
        credentials = await self.credentials(session, account_id, ref)
        return await self.fetcher.fetch(ref, credentials, digest=digest)

    # --- render and check ----------------------------------------------------------------

    async def render(
        self,
        fetched: FetchedChart,
        *,
        values: Mapping[str, Any] | None = None,
        namespace: str = PLACEHOLDER_NAMESPACE,
        kube_version: str | None = None,
        api_versions: Sequence[str] = (),
        engine: bool = False,
    ) -> RenderOutput:
        """Render like `helm template` (cached per archive and inputs); `engine` as in
        `ChartRenderer.render`.

        Raises:
            ChartRenderError: Helm refused the chart or values, or a limit was hit.
        """
        kube = kube_version or self.default_kube_version
        archive_key = fetched.layer_digest or fetched.digest
        key = _cache_key(archive_key, values or {}, namespace, kube, list(api_versions), engine)
        if key is not None:
            hit = self._renders.get(key)
            self.metrics.render_lookup(hit is not None)
            if hit is not None:
                return hit
        with self.tracing.span("chart.render", {"nvcf.chart.engine": engine}) as span:
            started = time.perf_counter()
            try:
                output = await self.renderer.render(
                    fetched.archive_path,
                    values=dict(values) if values else None,
                    namespace=namespace,
                    kube_version=kube,
                    api_versions=list(api_versions),
                    engine=engine,
                )
            except ChartRenderError:
                self.metrics.rendered("failed", time.perf_counter() - started)
                raise
            self.metrics.rendered(output.helm_path, time.perf_counter() - started)
            if span is not None:
                span.set_attribute("nvcf.chart.helm_path", output.helm_path)
        if key is not None:
            # the decoded objects go to this caller's check only; a hit decodes again
            self._renders.put(key, dataclasses.replace(output, decoded=None))
        return output

    async def validate(
        self,
        session: AsyncSession,
        account_id: str,
        *,
        helm_chart: str,
        service_name: str | None,
        inference_port: int,
        configuration: Mapping[str, Any] | None = None,
        policy: ValidationPolicy | None = None,
        instance_type: str | InstanceType | None = None,
        cluster: Cluster | None = None,
        digest: str | None = None,
        namespace: str | None = None,
    ) -> ChartValidation:
        """Run the whole pipeline and return every finding (never raises for chart rules).

        `configuration` is coalesced over the chart's values by Helm; `digest` pins the
        manifest recorded at creation (served from the cache when present); `cluster` is the
        target (`ChartTarget`: the Kubernetes version and API versions Helm renders with and
        the schema checks, the NVLink attribute), else the configured default version;
        `instance_type` the multi-node checks; `namespace` defaults to the creation
        placeholder. Registry and URL problems raise (400/502); render errors become
        `render-*` error findings.
        """
        ref = parse_ref(helm_chart)
        fetched = await self.fetch(session, account_id, ref, digest=digest)
        it = _instance_type(instance_type)
        ns = namespace or PLACEHOLDER_NAMESPACE
        target = ChartTarget.of(cluster, self.default_kube_version)
        result = ChartValidation(chart_digest=fetched.digest)
        check_key = _cache_key(
            fetched.layer_digest or fetched.digest,
            configuration or {},
            ns,
            target.key,
            target.cluster,
            service_name,
            inference_port,
            repr(policy or ValidationPolicy()),
            self.enforce_security,
            [it.nodes, it.gpus_per_node] if it is not None else None,
        )
        cached = self._checked.get(check_key) if check_key is not None else None
        if cached is not None:
            self.metrics.render_lookup(True)  # a checked render from memory: no render
            cached.fill(result)
            return result

        async def render(engine: bool) -> RenderOutput:
            return await self.render(
                fetched,
                values=configuration,
                namespace=ns,
                kube_version=target.kube_version,
                api_versions=target.api_versions,
                engine=engine,
            )

        def check(output: RenderOutput) -> tuple[PipelineResult, _Checked | None]:
            fresh = self._check(output, service_name, inference_port, policy, it, target)
            # the cache keeps JSON (each hit parses its own copy); this caller takes `fresh`
            return fresh, _Checked.of(fresh) if check_key is not None else None

        try:
            fresh, checked = await render_checked(render, check)
        except ChartRenderError as exc:
            result.add(Finding(exc.rule, "error", None, None, exc.detail))
            return result
        if check_key is not None and checked is not None:
            self._checked.put(check_key, checked)
        for part in dataclasses.fields(PipelineResult):
            setattr(result, part.name, getattr(fresh, part.name))
        return result

    def _check(
        self,
        output: RenderOutput,
        service_name: str | None,
        inference_port: int,
        policy: ValidationPolicy | None,
        it: InstanceType | None,
        target: ChartTarget,
    ) -> PipelineResult:
        """Decode, restrict, modify and schema-check one render (CPU work: runs in a
        thread)."""
        result = check_rendered(
            output,
            service_name=service_name,
            inference_port=inference_port,
            policy=policy,
            enforce_security=self.enforce_security,
            instance_type_nodes=it.nodes if it is not None else None,
            gpus_per_node=it.gpus_per_node if it is not None else None,
            nvlink=target.nvlink,
            schema_kube_version=target.kube_version,
            declared_api_versions=target.declared_api_versions,
        )
        result.add(*nvlink_annotation_findings(result.objects, target))
        return result

    async def validate_for_clusters(
        self,
        session: AsyncSession,
        account_id: str,
        *,
        clusters: Sequence[Cluster],
        **kw: Any,
    ) -> ChartValidation:
        """`validate` for every target among `clusters` (the candidates of a deployment
        specification or dry-run; none: no target). Clusters with the same capabilities
        (`ChartTarget.key`) share one render. Findings common to every target appear once;
        the others name the clusters they hold for. The objects are the first target's;
        when another target renders different objects, a `render-differs` warning says so.
        """
        if not clusters:
            return await self.validate(session, account_id, cluster=None, **kw)
        groups: dict[tuple[object, ...], list[Cluster]] = {}
        for cluster in clusters:
            key = ChartTarget.of(cluster, self.default_kube_version).key
            groups.setdefault(key, []).append(cluster)
        results: list[tuple[list[Cluster], ChartValidation]] = []
        for members in groups.values():
            results.append(
                (members, await self.validate(session, account_id, cluster=members[0], **kw))
            )
        if len(results) == 1:
            return results[0][1]
        return _merged(results)

    async def validate_for_create(
        self, session: AsyncSession, principal: Principal, spec: HelmFunctionSpec
    ) -> tuple[str, list[dict[str, Any]]]:
        """Validate a new helm function's chart with its default values and the request's
        helmValidationPolicy (the caller checked that some catalog cluster permits it).

        Returns the manifest digest and the warning and info findings as dicts
        `{rule, severity, object, field, message}`. Any error raises `ValidationFailed` (400)
        listing every error; registry failures raise 400/502 as `fetch` does.
        """
        if spec.helm_chart is None or spec.helm_chart_service_name is None:
            raise ValidationFailed.of(
                [FieldError(field="helmChart", message="a helm function needs helmChart")]
            )
        result = await self.validate(
            session,
            principal.account_id,
            helm_chart=spec.helm_chart,
            service_name=spec.helm_chart_service_name,
            inference_port=spec.inference_port or DEFAULT_INFERENCE_PORT,
            policy=spec.helm_validation_policy,
        )
        if result.errors:
            raise chart_validation_failed(spec.helm_chart, result.errors)
        return result.chart_digest, [f.as_dict() for f in (*result.warnings, *result.info)]

    # --- install preview -----------------------------------------------------------------

    def install_preview(
        self,
        objects: Sequence[KubeObject],
        *,
        cluster: Cluster,
        backend: str,
        instance_type: str | InstanceType | None,
        account_id: str,
        function_name: str = "dry-run",
        instance_id: str = PLACEHOLDER_INSTANCE_ID,
    ) -> list[KubeObject]:
        """The objects a backend would receive for one placeholder instance on `cluster`.

        Pull-secret Secrets are left out: their contents are account credentials, which never
        appear in responses. The Secret of the version's secrets (`nvcf-secrets`) is shown
        with an empty `secrets.json`, mounted at /var/secrets in every container: where an
        instance's secrets go, never their values.
        """
        it = _instance_type(instance_type)
        if it is None:
            offered = cluster.offered_instance_types()
            it = offered[0] if offered else None
        placeholder = str(uuid.UUID(int=0))
        return mutate_for_install(
            objects,
            namespace=instance_namespace(instance_id),
            instance_id=instance_id,
            function_id=placeholder,
            version_id=placeholder,
            function_name=function_name,
            nca_id=account_id,
            instance_type=it.name if it is not None else "",
            backend=backend,
            region=cluster.region,
            nvlink=cluster_is_nvlink(cluster),
            secrets={},
        )


def _names(clusters: Sequence[Cluster]) -> str:
    return ", ".join(
        f"{c.name} (Kubernetes {c.k8s_version})" if c.k8s_version else c.name for c in clusters
    )


def _merged(results: Sequence[tuple[list[Cluster], ChartValidation]]) -> ChartValidation:
    """One validation of several targets (see `ChartPipeline.validate_for_clusters`)."""
    first_members, first = results[0]
    merged = ChartValidation(chart_digest=first.chart_digest)
    merged.objects = first.objects
    merged.workload_config = first.workload_config
    merged.hooks_skipped = first.hooks_skipped
    merged.crds_skipped = first.crds_skipped
    holds: dict[Finding, list[Cluster]] = {}
    for members, result in results:
        for finding in result.findings:
            holds.setdefault(finding, []).extend(
                m for m in members if m not in holds.get(finding, [])
            )
    everywhere = sum(len(members) for members, _ in results)
    for finding, where in holds.items():
        if len(where) == everywhere:
            merged.add(finding)
        else:
            merged.add(
                dataclasses.replace(finding, message=f"{finding.message} (on {_names(where)})")
            )
    for members, result in results[1:]:
        if result.valid and first.valid and result.objects != first.objects:
            merged.add(
                Finding(
                    "render-differs",
                    "warning",
                    None,
                    None,
                    f"the chart renders different objects for {_names(members)} than for "
                    f"{_names(first_members)}; instances install the objects rendered for "
                    f"{first_members[0].name}",
                )
            )
    return merged


def cluster_is_nvlink(cluster: Cluster | None) -> bool:
    return cluster is not None and is_nvlink(cluster.attributes)


def _instance_type(value: str | InstanceType | None) -> InstanceType | None:
    if value is None or isinstance(value, InstanceType):
        return value
    return parse_instance_type(value)


__all__ = [
    "ChartFieldError",
    "ChartPipeline",
    "ChartValidation",
    "chart_validation_failed",
    "parse_ref",
]
