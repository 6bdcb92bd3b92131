"""The platform's settings (a part of `Settings`, service/core/settings.py): storage and identity,
chart registries and the chart pipeline, per-account quotas, assets and large results, the API
rate limit, speed-ups."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field, SecretStr
from pydantic_settings import NoDecode

#: a comma list: `a, B,c` is {"a", "b", "c"} (see `comma_list`)
CommaList = Annotated[frozenset[str], NoDecode]


def comma_list(value: object) -> object:
    """A comma list setting read from its text, lower-cased, empty items dropped."""
    if isinstance(value, str):
        return frozenset(p.strip().lower() for p in value.split(",") if p.strip())
    return value


class PlatformSettings(BaseModel):
    # -- storage and identity
    data_dir: Path = Field(
        default=Path("./.nvcf"),
        description="Directory of the SQLite file, the chart cache, the generated secrets key "
        "and the generated admin key.",
    )
    database_url: str | None = Field(
        default=None,
        description="`sqlite+aiosqlite:///path` or `postgresql+psycopg://user:pw@host:port/db`; "
        "unset: SQLite in the data directory. Several replicas need PostgreSQL.",
    )
    clusters_file: Path | None = Field(
        default=None,
        description="Cluster catalog YAML; unset: the built-in catalog of simulated clusters.",
    )
    default_account: str = Field(
        default="nvcf-default",
        min_length=1,
        max_length=128,
        description="Account (NCA id) of the bootstrap and the generated admin key.",
    )
    bootstrap_api_key: SecretStr | None = Field(
        default=None,
        description="An `nvapi-` key that exists with every scope (and the operator scope) for "
        "the default account; unset and no key stored: one is generated and printed once.",
    )
    jwt_secret: SecretStr | None = Field(
        default=None, description="HS256 secret verifying bearer JWTs."
    )
    jwks_url: str | None = Field(default=None, description="JWKS URL verifying bearer JWTs.")
    jwks_file: Path | None = Field(default=None, description="JWKS file verifying bearer JWTs.")
    secrets_key: SecretStr | None = Field(
        default=None,
        description="Key encrypting stored function secrets and registry passwords; unset: "
        "generated into the data directory. Back it up with the database.",
    )
    auto_migrate: bool = Field(default=True, description="Apply the database migrations at start.")
    # -- chart registries and the chart pipeline
    registry_allowlist: CommaList = Field(
        default=frozenset(),
        description="Comma list of `host[:port]` chart registries allowed although they "
        "resolve to private or loopback addresses.",
    )
    telemetry_allowlist: CommaList = Field(
        default=frozenset(),
        description="Comma list of `host[:port]` telemetry endpoints allowed although they "
        "resolve to private, loopback or link-local addresses (docs/telemetry-export.md).",
    )
    telemetry_collector_image: str = Field(
        default="otel/opentelemetry-collector-contrib:0.165.1",
        max_length=512,
        description="The OpenTelemetry Collector (contrib) image that Kubernetes clusters add as "
        "a sidecar to the pods of a function or task naming telemetries (docs/telemetry-"
        "export.md); 0.154 or later (its configuration names the components `otlp_http`, "
        "`file_log`, ...); empty: none, and such workloads export nothing from Kubernetes.",
    )
    telemetry_queue_size: int = Field(
        default=10000,
        ge=1,
        le=1_000_000,
        description="Invocations waiting to be exported to tenants' telemetry endpoints "
        "(in-process export); beyond it they are dropped and counted "
        "(`nvcf_telemetry_dropped_total`).",
    )
    telemetry_export_interval: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="Seconds between two metric exports to a telemetry endpoint, and the "
        "longest a span waits for its batch.",
    )
    telemetry_log_followers: int = Field(
        default=1000,
        ge=1,
        le=100_000,
        description="Instances whose logs one replica follows at once for LOGS telemetries "
        "(in-process export); beyond it an instance's lines are not exported and counted "
        '(`nvcf_telemetry_dropped_total{reason="log_followers_full"}`).',
    )
    telemetry_export_timeout: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description="Seconds one export to a telemetry endpoint may take, retries included.",
    )
    metering_flush_seconds: float = Field(
        default=5.0,
        gt=0,
        le=300,
        description="Seconds between two additions of a replica's invocation and token counts "
        "to the database (docs/usage.md); a replica that dies loses at most this much.",
    )
    insecure_registries: CommaList = Field(
        default=frozenset(),
        description="Comma list of `host[:port]` registries (of charts, of task results) "
        "spoken to over plain HTTP.",
    )
    helm_enforce_security: bool = Field(
        default=False, description="Turn security and resource findings of charts into errors."
    )
    chart_max_bytes: int = Field(
        default=10 * 1024 * 1024, gt=0, description="Largest chart archive pulled, in bytes."
    )
    chart_max_unpacked_bytes: int = Field(
        default=50 * 1024 * 1024, gt=0, description="Largest unpacked chart, in bytes."
    )
    render_timeout: float = Field(
        default=30.0, gt=0, description="Seconds one Helm render may take."
    )
    render_workers: int = Field(default=2, ge=1, le=64, description="Helm render worker processes.")
    render_memory_limit_bytes: int = Field(
        default=1024 * 1024 * 1024,
        ge=0,
        description="Address-space limit of a render worker, in bytes (0: none).",
    )
    helm_engine_path: bool = Field(
        default=True,
        description="Render simple charts with the Helm engine alone; false forces Helm's "
        "install action for every chart (service/charts/helm_engine.py).",
    )
    chart_cache_max_bytes: int = Field(
        default=2 * 1024 * 1024 * 1024,
        gt=0,
        description="Size of the on-disk chart cache, in bytes (least recently used go first).",
    )
    chart_fetch_timeout: float = Field(
        default=30.0, gt=0, description="Seconds for each registry request of a chart pull."
    )
    default_kube_version: str = Field(
        default="1.30.0",
        pattern=r"^v?\d+\.\d+(\.\d+)?$",
        description="Kubernetes version charts are rendered for when the target does not say.",
    )
    # -- per-account quotas (service/core/quotas.py)
    quota_functions: int = Field(default=1000, ge=1, description="Functions per account.")
    quota_versions_per_function: int = Field(
        default=100, ge=1, description="Versions per function."
    )
    quota_instances: int = Field(
        default=1000,
        ge=1,
        description="Instances per account: the maxInstances of its live deployments.",
    )
    quota_registry_credentials: int = Field(
        default=50, ge=1, description="Registry credentials per account."
    )
    quota_telemetries: int = Field(
        default=50,
        ge=1,
        le=50,
        description="Telemetry endpoints per account (NVCF's cap: 50; docs/telemetry-export.md).",
    )
    quota_api_keys: int = Field(default=100, ge=1, description="API keys per account.")
    quota_tasks: int = Field(
        default=1000,
        ge=1,
        le=2_147_483_647,
        description="Tasks per account, in any status (NVCF's maxTasksAllowed); deleting a "
        "task frees its place.",
    )
    quota_active_tasks: int = Field(
        default=100,
        ge=1,
        description="Tasks per account queued, launched or running at once.",
    )
    quota_assets: int = Field(
        default=1000, ge=1, description="Assets per account (not yet expired, uploaded or not)."
    )
    quota_asset_bytes: int = Field(
        default=100 * 1024 * 1024 * 1024,
        ge=1,
        description="Bytes of assets per account: an uploaded one counts its size, one not yet "
        "uploaded `NVCF_ASSET_MAX_BYTES` until it is; an upload URL is signed only while there "
        "is room, and an upload that would pass it is refused.",
    )
    # -- assets and large results (service/assets/, docs/assets.md)
    asset_storage: Literal["local", "s3"] = Field(
        default="local",
        description="Where assets and large results are kept: `local`, the `storage` folder "
        "of the data directory, this server signing and serving the upload and download URLs "
        "(one replica); `s3`, an S3-compatible object store (several replicas), which signs "
        "them.",
    )
    asset_s3_bucket: str | None = Field(
        default=None,
        min_length=3,
        max_length=63,
        description="`s3` storage: the bucket (it must exist); objects are kept under "
        "`assets/` and `results/`.",
    )
    asset_s3_endpoint_url: str | None = Field(
        default=None,
        pattern=r"^https?://",
        description="`s3` storage: the store's endpoint (e.g. `http://minio:9000`); unset: "
        "AWS S3. Callers and workers use the signed URLs, so it must be reachable by them.",
    )
    asset_s3_region: str = Field(
        default="us-east-1", min_length=1, description="`s3` storage: the region signed for."
    )
    asset_s3_access_key_id: SecretStr | None = Field(
        default=None,
        description="`s3` storage: the access key id; unset: the AWS client's own chain "
        "(environment, shared files, instance role).",
    )
    asset_s3_secret_access_key: SecretStr | None = Field(
        default=None, description="`s3` storage: the secret access key (with the key id)."
    )
    asset_public_url: str | None = Field(
        default=None,
        pattern=r"^https?://",
        description="`local` storage: the base URL the signed URLs start with (e.g. "
        "`https://nvcf.example.com`); unset: the base URL of the request that asks for one. "
        "A host name of its own keeps downloads off the API's origin (docs/security.md).",
    )
    asset_ttl_seconds: float = Field(
        default=86_400.0,
        gt=0,
        description="Seconds an asset is kept after it was created; then it is deleted and "
        "a reference to it is refused.",
    )
    asset_url_seconds: int = Field(
        default=2100,
        ge=1,
        le=604_800,
        description="Seconds a signed upload or download URL stays valid (NVCF: 35 minutes).",
    )
    asset_max_bytes: int = Field(
        default=5 * 1024 * 1024 * 1024,
        gt=0,
        description="Largest asset, in bytes: `local` storage refuses a larger upload (413); "
        "with `s3` a larger object is refused and deleted when it is first referenced.",
    )
    asset_upload_timeout_seconds: float = Field(
        default=3600.0,
        gt=0,
        description="`local` storage: seconds an upload's body may take to arrive (instead of "
        "`NVCF_HTTP_BODY_TIMEOUT`, which bounds every other request body).",
    )
    asset_max_references: int = Field(
        default=32,
        ge=1,
        le=1000,
        description="Assets one invocation may reference.",
    )
    asset_result_max_bytes: int = Field(
        default=5 * 1024 * 1024 * 1024,
        gt=0,
        description="Largest large result (the answer body and the files a worker writes, "
        "zipped), in bytes; a larger one ends the request errored.",
    )
    asset_result_max_files: int = Field(
        default=1000,
        ge=1,
        description="Files a worker may write into its NVCF-LARGE-OUTPUT-DIR for one request.",
    )
    asset_files_dir: Path | None = Field(
        default=None,
        description="Where the per-request asset and output directories of workers on this "
        "machine (the simulated clusters) are made; unset: `request-files` in the data "
        "directory.",
    )
    worker_utils_image: str = Field(
        default="nvcf-server:latest",
        max_length=512,
        description="The image of the worker-utils sidecar (`nvcf-server worker-utils`: this "
        "project's own image, the one the servers run) that Kubernetes clusters add to the "
        "pod serving a function, for input assets, large results and progress (docs/"
        "kubernetes.md); empty: no sidecar, and a request with input assets for a function on "
        "Kubernetes is refused (503).",
    )
    worker_utils_image_registries: CommaList = Field(
        default=frozenset(),
        description="Comma list of `host[:port]` registries a function's `utilsContainerImage` "
        "(the image of its worker-utils sidecar on Kubernetes) may name; the repository of "
        "`NVCF_WORKER_UTILS_IMAGE` (any tag) is always allowed. NVCF's selectors `PYTHON` and "
        "`GO` mean `NVCF_WORKER_UTILS_IMAGE` itself.",
    )
    asset_purge_period_seconds: float = Field(
        default=300.0,
        ge=0,
        description="Seconds between purges of expired assets, old large results and "
        "abandoned uploads (0: never).",
    )
    # -- task results (service/tasks/results.py, docs/tasks.md)
    task_results_registry: str | None = Field(
        default=None,
        max_length=255,
        description="`host[:port][/path]` of the OCI registry the checkpoints of "
        "`resultHandlingStrategy: UPLOAD` tasks are pushed to: a task's `resultsLocation` "
        "`org/[team/]model` is the repository `[path/]org/[team/]model` there, each result "
        "tagged with its name; spoken to over plain HTTP when its `host[:port]` is in "
        "`NVCF_INSECURE_REGISTRIES`. Unset: `UPLOAD` is refused.",
    )
    task_results_push_attempts: int = Field(
        default=3, ge=1, le=10, description="Attempts to push one result before the task errs."
    )
    task_results_push_backoff: float = Field(
        default=2.0,
        ge=0,
        le=300,
        description="Seconds before the second attempt of a result push, doubled before each "
        "next one.",
    )
    task_results_push_timeout: float = Field(
        default=60.0, gt=0, description="Seconds for each registry request of a result push."
    )
    task_result_max_bytes: int = Field(
        default=10 * 1024 * 1024 * 1024,
        gt=0,
        description="Largest result (the files of one checkpoint) pushed, in bytes; a larger "
        "one errs the task.",
    )
    task_result_max_files: int = Field(
        default=10_000, ge=1, description="Files one result (checkpoint) may hold."
    )
    # -- per-account API rate limit (service/core/ratelimit.py)
    rate_limit_per_second: float = Field(
        default=100.0,
        ge=0,
        le=1_000_000,
        description="Requests per second per account on average (0: off); an account's own "
        "`rateLimitPerSecond` replaces it.",
    )
    rate_limit_burst: int = Field(
        default=1000,
        ge=1,
        le=2_147_483_647,
        description="Requests an account may send at once; an account's own `rateLimitBurst` "
        "replaces it.",
    )
    redis_url: str | None = Field(
        default=None,
        pattern=r"^rediss?://",
        description="Redis shared by replicas: the API and function rate-limit counters, the "
        "LLM token counters, the invocation queues and per-instance requests in flight, and "
        "the gRPC sessions; unset: all in memory.",
    )
    # -- speed-ups (service/functions/read_cache.py)
    version_read_cache: bool = Field(
        default=True,
        description="Cache serialised version reads (and their fast path); effective with "
        "SQLite only, where one process sees every commit.",
    )
