"""Service settings (operations.md §2): environment variables prefixed `NVCF_`, or a `.env` file."""

from __future__ import annotations

import ipaddress
from functools import cached_property
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

CommaList = Annotated[frozenset[str], NoDecode]


def _split(value: object) -> object:
    if isinstance(value, str):
        return frozenset(p.strip().lower() for p in value.split(",") if p.strip())
    return value


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="NVCF_", env_file=".env", extra="ignore", frozen=True
    )

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
    insecure_registries: CommaList = Field(
        default=frozenset(),
        description="Comma list of `host[:port]` chart registries spoken to over plain HTTP.",
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
    quota_api_keys: int = Field(default=100, ge=1, description="API keys per account.")
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
    # -- per-account API rate limit (service/core/ratelimit.py)
    rate_limit_per_second: float = Field(
        default=100.0, ge=0, description="Requests per second per account on average (0: off)."
    )
    rate_limit_burst: int = Field(
        default=1000, ge=1, description="Requests an account may send at once."
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
    # -- the reconciler (service/deployments/reconcile/)
    reconciler_enabled: bool = Field(
        default=True, description="Run the reconciler in this process."
    )
    reconcile_interval: float = Field(
        default=2.0,
        gt=0,
        description="Seconds between reconciler passes (it also wakes on every change).",
    )
    reconcile_lease_seconds: float = Field(
        default=60.0, gt=0, description="Seconds a replica's claim on a deployment lasts."
    )
    reconcile_resync_seconds: float = Field(
        default=3600.0,
        ge=0,
        description="Safety net: a Running instance with no timer pending is observed again "
        "this often even when its cluster reported no change of it (clusters report changes: "
        "the Kubernetes watch, the simulated timeline), at a slot of its own so the fleet's "
        "resyncs are spread evenly over the period; every instance is also observed at "
        "start-up and after a cluster's watch was re-established.",
    )
    reconcile_concurrency: int = Field(
        default=8, ge=1, le=256, description="Backend calls in flight at once."
    )
    reconcile_batch_size: int = Field(
        default=50,
        ge=1,
        le=1000,
        description="Deployments claimed and finished together in one unit of work (one "
        "transaction each).",
    )
    reconcile_deploy_attempts: int = Field(
        default=3,
        ge=1,
        le=100,
        description="While a version is DEPLOYING: instances tried per instance of a "
        "specification's minInstances (the first and the replacements of failed ones). The "
        "version goes to ERROR once as many instances as the minimum have failed with none "
        "left, or once a specification is out of attempts below its minimum.",
    )
    reconcile_gc_seconds: float = Field(
        default=3600.0,
        ge=0,
        description="Seconds between collections of orphaned instance namespaces, a safety "
        "net that reads every instance id (0: off).",
    )
    reconcile_gc_timeout_seconds: float = Field(
        default=60.0, gt=0, description="Seconds one garbage collection round may take."
    )
    reconcile_gc_min_age_seconds: float = Field(
        default=120.0, ge=0, description="Namespaces younger than this are never collected."
    )
    drain_timeout_seconds: float = Field(
        default=300.0,
        ge=0,
        description="Seconds an instance being removed (rolling update, scale-down, "
        "`DELETE ...?graceful=true`) may take to finish its requests in flight (and, for a "
        "graceful undeploy, those queued) before it is torn down anyway.",
    )
    # -- history of removed deployments (service/deployments/history.py)
    history_retention_seconds: float = Field(
        default=7 * 86400.0,
        ge=0,
        description="Seconds a removed deployment stays readable after its removal (its "
        "timeline at `GET /v2/nvcf/deployments/{id}/events`, its failed instances, the "
        "version's `.../history`); then it is purged. 0 keeps no history.",
    )
    history_purge_seconds: float = Field(
        default=600.0,
        ge=0,
        description="Seconds between purges of expired deployment history (0: off), in a "
        "process that runs the reconciler.",
    )
    admin_token_networks: CommaList = Field(
        default=frozenset(),
        description="Comma list of CIDRs (e.g. `10.0.0.0/8`) whose clients get a management "
        "token for the default account from `POST /v1/admin/keys`, and revoke its non-operator "
        "keys with `DELETE /v1/keys/{id}`, without a credential, as NVCF's admin-issuer proxy "
        "inside a cluster (for `nvcf-cli init` and `api-key delete`); empty: a credential with "
        "scope `admin` is always needed. Behind a reverse proxy (nginx, a cluster ingress) "
        "every caller has the proxy's internal address: never list the proxy's network. A "
        "request carrying a proxy header (`Forwarded`, `X-Forwarded-For`, `X-Real-IP`, ...) "
        "is refused without a credential (401) whatever its address.",
    )
    timeseries_period_seconds: float = Field(
        default=10.0,
        ge=0,
        description="Seconds between samples of each function version's requests, latency, "
        "queue depth and instances kept for an hour for the console's charts "
        "(`GET .../versions/{id}/metrics`; this replica's counts); 0: off.",
    )
    # -- instance logs (service/deployments/logs/, docs/logs.md)
    logs_max_tail_lines: int = Field(
        default=10_000,
        gt=0,
        description="Most lines `GET .../logs` returns per container (`tailLines` may ask "
        "fewer; without it, this many of the last).",
    )
    logs_max_bytes: int = Field(
        default=8 * 1024 * 1024,
        gt=0,
        description="Most bytes one `GET .../logs` answer carries (a follow ends, with a note "
        "line, once it has sent this many).",
    )
    logs_max_follows_per_account: int = Field(
        default=4,
        ge=1,
        description="Log follows (`follow=true`) one account may have open at once in one "
        "server process; one more is answered 429.",
    )
    logs_follow_max_seconds: float = Field(
        default=3600.0,
        gt=0,
        description="Longest a log follow stays open; then it ends (the caller may follow again).",
    )
    logs_kept_lines: int = Field(
        default=200,
        ge=0,
        description="Last lines of each container kept when an instance fails (shown after it "
        "was torn down) or when a container of a Running instance restarts; 0 keeps none.",
    )
    logs_kept_bytes: int = Field(
        default=64 * 1024,
        gt=0,
        description="Most bytes of the last lines kept per container (a failure's or a restart's).",
    )
    # -- the autoscaler (service/deployments/autoscale/, docs/autoscaling.md)
    autoscale_enabled: bool = Field(
        default=True,
        description="Run the autoscaler in this process (where the reconciler runs; several "
        "replicas may run it: each decision is taken under the deployment's row lock).",
    )
    autoscale_interval: float = Field(
        default=5.0,
        gt=0,
        description="Seconds between the autoscaler's readings of the load (it also wakes at "
        "once for a request queued on a version with no Running instance).",
    )
    autoscale_window_seconds: float = Field(
        default=60.0,
        gt=0,
        description="Seconds over which utilisation is averaged before it is compared with a "
        "threshold (samples since the last decision, at most this old).",
    )
    autoscale_idle_seconds: float = Field(
        default=1800.0,
        ge=0,
        description="A GPU specification with `minInstances: 0` goes to zero instances after "
        "this many seconds without a request, its utilisation below the scale-down threshold "
        "and its load signal present all along.",
    )
    autoscale_up_stickiness_seconds: float = Field(
        default=30.0,
        ge=0,
        description="Platform policy: seconds utilisation must stay above the scale-up "
        "threshold before the instance count grows (the stickiness threshold; the window is "
        "twice as long).",
    )
    autoscale_down_stickiness_seconds: float = Field(
        default=120.0,
        ge=0,
        description="Platform policy: seconds utilisation must stay below the scale-down "
        "threshold before the instance count shrinks (the stickiness threshold; the window is "
        "twice as long).",
    )
    autoscale_load_report_seconds: float = Field(
        default=1.0,
        gt=0,
        description="Seconds between an invocation replica's reports of its per-version load "
        "to the database (also at once when a request waits for a version with no instance).",
    )
    autoscale_load_stale_seconds: float = Field(
        default=15.0,
        gt=0,
        description="A replica whose last load report is older than this has no signal: the "
        "autoscaler holds every version's count rather than read it as zero load.",
    )
    # -- instance health (docs/health.md)
    health_pod_scheduling_timeout: float = Field(
        default=600, ge=0, description="Seconds a pod may stay unschedulable."
    )
    health_image_pull_timeout: float = Field(
        default=60,
        ge=0,
        description="Seconds an image pull (or container creation) may keep failing.",
    )
    health_restart_loop_timeout: float = Field(
        default=600, ge=0, description="Seconds a container may keep restarting."
    )
    health_init_timeout: float = Field(
        default=7200, ge=0, description="Seconds init containers (or a Pending pod) may take."
    )
    health_worker_startup_timeout: float = Field(
        default=7200, ge=0, description="Seconds a worker may take to become ready."
    )
    health_worker_degradation_period: float = Field(
        default=1800, ge=0, description="Seconds a worker that was ready may stay not ready."
    )
    health_pending_timeout: float = Field(
        default=10800, ge=0, description="Seconds an instance may take to be Running at all."
    )
    health_failing_backoff: float = Field(
        default=90, ge=0, description="Seconds a failing object may recover before it fails."
    )
    # -- invocation (service/invocation/)
    invoke_enabled: bool = Field(
        default=True,
        description="Serve the invocation routes (pexec, exec, status, queues, transparent "
        "mode) in this process; `nvcf-server invoke` runs them alone.",
    )
    invoke_host_suffix: str | None = Field(
        default=None,
        max_length=253,
        description="Transparent mode: a request whose Host is `<functionId>[.<versionId>]."
        "<suffix>` is forwarded to the function (e.g. `invocation.localhost`); unset: any "
        "suffix, as long as the first label is a UUID.",
    )
    invoke_max_body_bytes: int = Field(
        default=5 * 1024 * 1024, gt=0, description="Largest invocation request body, in bytes."
    )
    llm_model_allowlist: bool = Field(
        default=False,
        description="LLM gateway: refuse a request whose model the function does not declare "
        "(404) or whose path the model's `llmConfig.uris` do not list (400). Off (NVCF's "
        "default, its MODEL_URI_ALLOWLIST_ENABLED): such requests reach the worker and are "
        "logged.",
    )
    invoke_result_max_bytes: int = Field(
        default=5 * 1024 * 1024,
        gt=0,
        description="Largest worker response kept for polling (and wrapped by exec), in bytes; "
        "a larger one ends the request errored.",
    )
    invoke_result_ttl_seconds: float = Field(
        default=3600.0,
        gt=0,
        description="Seconds a polled request's state and result are kept after it started.",
    )
    invoke_progress_period_seconds: float = Field(
        default=1.0,
        ge=0,
        description="Seconds between reads of a detached request's progress report (docs/"
        "assets.md) by the replica running it, which stores it when it changed so that polls "
        "reaching another replica show it (0: never; polls on that replica still do).",
    )
    invoke_queue_max: int = Field(
        default=1000,
        ge=0,
        le=1_000_000,
        description="Requests waiting per function version for a free instance; more are "
        "refused 429.",
    )
    invoke_queue_timeout_seconds: float = Field(
        default=600.0,
        gt=0,
        description="Seconds a request may wait in its queue before it ends errored.",
    )
    invoke_worker_timeout_seconds: float = Field(
        default=3600.0,
        gt=0,
        description="Seconds a worker may take to answer a request completely.",
    )
    invoke_route_cache_seconds: float = Field(
        default=1.0,
        ge=0,
        description="Seconds a function version's invocable instances are reused between "
        "database reads (0: read for every request).",
    )
    invoke_worker_max_head_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        description="Bytes of a worker answer's head (status line, headers, interim answers), "
        "and of the framing between its body bytes (a chunk-size line with its extensions, the "
        "trailer section); more end the request errored (502, or the caller's connection closed "
        "once the head went out) and the worker connection is closed.",
    )
    invoke_worker_max_headers: int = Field(
        default=100,
        ge=10,
        description="Header lines of a worker answer, and trailer lines of a chunked one; more "
        "end the request errored (502, or the caller's connection closed once the head went "
        "out).",
    )
    invoke_processes: int = Field(
        default=1,
        ge=1,
        le=64,
        description="`nvcf-server invoke`: processes serving the invocation plane on its one "
        "port (`--processes` overrides), each its own replica; more than one needs "
        "`NVCF_REDIS_URL` (replicas share queues and counters only through Redis).",
    )
    invoke_replica_lease_seconds: float = Field(
        default=30.0,
        gt=0,
        description="A replica that has not renewed its heartbeat for this long is gone: its "
        "pending requests end errored.",
    )
    invoke_token_seconds: int = Field(
        default=600,
        ge=1,
        le=86_400,
        description="Lifetime in seconds of the invocation tokens `POST /v2/nvcf/tokens/"
        "functions...` issues (NVCF: 600), or less: never past the expiry of the API key that "
        "asks for one; an expired token is refused 401. Tokens are not revoked one by one.",
    )
    # -- gRPC invocation (service/invocation/grpc/)
    grpc_enabled: bool = Field(
        default=True,
        description="Serve gRPC functions (inferenceUrl `/gRPC`) on their own port wherever the "
        "invocation routes are served (`NVCF_INVOKE_ENABLED`, `nvcf-server invoke`).",
    )
    grpc_host: str | None = Field(
        default=None,
        max_length=253,
        description="Address the gRPC listener binds; unset: the HTTP server's `--host` "
        "(127.0.0.1 for an application started otherwise).",
    )
    grpc_port: int = Field(
        default=10081,
        ge=0,
        le=65535,
        description="Port of the gRPC listener (NVCF's local gateway port); 0: any free port.",
    )
    grpc_tls_cert: Path | None = Field(
        default=None,
        description="PEM certificate of the gRPC listener; unset: the HTTP server's (`--tls-cert` "
        "or `--tls-self-signed`), and plaintext (h2c) when that serves plain HTTP.",
    )
    grpc_tls_key: Path | None = Field(
        default=None, description="The private key of `NVCF_GRPC_TLS_CERT` (PEM)."
    )
    grpc_max_message_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=1024,
        le=2**31 - 1,
        description="Largest gRPC message, in bytes, either way (caller to worker, worker to "
        "caller); a larger one ends the call RESOURCE_EXHAUSTED.",
    )
    grpc_worker_channels: int = Field(
        default=256,
        ge=1,
        le=100_000,
        description="Worker addresses the gRPC listener keeps an open channel (HTTP/2 "
        "connection) to; the least recently used idle one is closed for another.",
    )
    grpc_channel_idle_seconds: float = Field(
        default=300.0,
        gt=0,
        description="A channel to a worker that carried no call for this long is closed.",
    )
    grpc_session_idle_seconds: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        description="A gRPC session (its first call's `nvcf-reqid`) can be resumed on its "
        "instance while one of its calls is open and for this many seconds after the last one "
        "ended (a client reconnecting; NVCF keeps idle gRPC connections 30 s); 0: it ends with "
        "its last call. Shared by every replica through `NVCF_REDIS_URL`.",
    )
    # -- HTTP (service/core/server.py)
    gc_freeze: bool = Field(
        default=True,
        description="`serve` and `invoke`: once the application is built, move the objects "
        "alive at start-up out of the cyclic garbage collector's reach (`gc.freeze`), so its "
        "full collections walk only what requests created instead of pausing every request.",
    )
    max_body_bytes: int = Field(
        default=1024 * 1024, gt=0, description="Largest request body, in bytes."
    )
    http_header_timeout: float = Field(
        default=10.0,
        gt=0,
        description="Seconds for a request head to arrive from its first byte (or from the "
        "connection opening).",
    )
    http_body_timeout: float = Field(
        default=60.0, gt=0, description="Seconds for a request body to arrive after its head."
    )
    http_keepalive_timeout: float = Field(
        default=5.0, gt=0, description="Seconds an idle kept-alive connection stays open."
    )
    http_send_timeout: float = Field(
        default=60.0,
        gt=0,
        description="Seconds sending an answer may make no progress (the caller reads nothing "
        "of it); then the answer is abandoned and its connection closed (an invocation's "
        "worker request ended, its instance slot freed).",
    )
    http_max_head_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        description="Bytes of a request head (request line and headers); a larger one is "
        "answered 431 and its connection closed.",
    )
    http_max_headers: int = Field(
        default=100,
        ge=10,
        description="Header lines of a request; more are answered 431 and the connection closed.",
    )
    http_max_connections: int = Field(
        default=1000,
        ge=1,
        description="Connections open at once (fewer when the file-descriptor limit is "
        "lower); each one beyond is answered 503 and closed.",
    )
    idempotency_ttl_seconds: int = Field(
        default=24 * 3600, gt=0, description="Seconds an Idempotency-Key answer is replayed."
    )
    # -- telemetry (docs/telemetry.md)
    log_format: Literal["text", "json"] = Field(
        default="text",
        description="`json`: every log line is one JSON object (timestamp, level, logger, "
        "message, requestId).",
    )
    metrics_fleet_cache_seconds: float = Field(
        default=15.0,
        ge=0,
        description="Seconds the fleet gauges of `/metrics` (versions by status, instances by "
        "phase and cluster) are reused before the database is counted again (0: every scrape).",
    )
    metrics_token: SecretStr | None = Field(
        default=None,
        min_length=32,
        description="A bearer token a Prometheus scraper presents on `/metrics` to read the "
        "series that name tenants' objects (per function version); an operator key "
        "(`admin:accounts`) reads them too. Without either, `/metrics` serves the others only. "
        "At least 32 characters.",
    )
    otel_endpoint: str | None = Field(
        default=None,
        pattern=r"^https?://",
        description="OTLP/HTTP collector (`http://collector:4318`; spans go to "
        "`<endpoint>/v1/traces`); unset: tracing is off and costs nothing.",
    )
    otel_service_name: str = Field(
        default="nvcf-server",
        min_length=1,
        description="`service.name` of the spans this process exports.",
    )

    @field_validator(
        "registry_allowlist", "insecure_registries", "worker_utils_image_registries", mode="before"
    )
    @classmethod
    def _comma_list(cls, value: object) -> object:
        return _split(value)

    @field_validator("admin_token_networks", mode="before")
    @classmethod
    def _networks(cls, value: object) -> object:
        split = _split(value)
        for network in split if isinstance(split, frozenset) else ():
            try:
                ipaddress.ip_network(network, strict=False)
            except ValueError as exc:
                raise ValueError(f"not a network (CIDR): {network!r}") from exc
        return split

    @field_validator("invoke_host_suffix")
    @classmethod
    def _host_suffix(cls, value: str | None) -> str | None:
        if value is None or not value.strip(". "):
            return None
        return value.strip(". ").lower()

    @field_validator("bootstrap_api_key")
    @classmethod
    def _bootstrap_shape(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().startswith("nvapi-"):
            raise ValueError("must start with 'nvapi-'")
        return value

    @field_validator("database_url")
    @classmethod
    def _db_driver(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if not value.startswith(("sqlite+aiosqlite://", "postgresql+psycopg://")):
            raise ValueError("must start with 'sqlite+aiosqlite://' or 'postgresql+psycopg://'")
        return value

    @field_validator("otel_endpoint", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("asset_s3_bucket", "asset_s3_endpoint_url", "asset_public_url", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if value == "" else value

    @model_validator(mode="after")
    def _s3_needs_bucket(self) -> Settings:
        if self.asset_storage == "s3" and self.asset_s3_bucket is None:
            raise ValueError("NVCF_ASSET_STORAGE=s3 needs NVCF_ASSET_S3_BUCKET")
        if (self.asset_s3_access_key_id is None) != (self.asset_s3_secret_access_key is None):
            raise ValueError(
                "NVCF_ASSET_S3_ACCESS_KEY_ID and NVCF_ASSET_S3_SECRET_ACCESS_KEY go together"
            )
        return self

    @property
    def asset_files_root(self) -> Path:
        """Where per-request asset and output directories are made."""
        return self.asset_files_dir or self.data_dir / "request-files"

    @cached_property
    def effective_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite+aiosqlite:///{(self.data_dir / 'nvcf.db').resolve()}"


def settings_error_line(exc: Exception) -> str:
    """One line naming the bad setting(s), for start-up failures."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        parts = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"])
            parts.append(f"NVCF_{loc.upper()}: {err['msg']}")
        return "invalid setting: " + "; ".join(parts)
    return f"invalid setting: {exc}"
